"""The demand socket (agent/demand_server.py): a real Unix socket, the broker over fake ports. The
proxy's held request gets waiting lines, then one final line; closing its end cancels the request."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.demand_server import DemandServer
from tests.hosts.wait import wait_for

from .test_demand_broker import DemandWorld


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[DemandWorld, str]]:
    dw = DemandWorld(tmp_path)
    path = str(tmp_path / "demand.sock")
    server = DemandServer(path, dw.broker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield dw, path
    server.shutdown()
    server.server_close()


def ask(path: str, line: bytes, *, replies: int | None = None) -> tuple[socket.socket, list[dict[str, Any]]]:
    """Send one line; read ``replies`` lines (None: until the agent closes)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    sock.sendall(line)
    reader = sock.makefile("rb")
    out: list[dict[str, Any]] = []
    while replies is None or len(out) < replies:
        raw = reader.readline()
        if not raw:
            break
        out.append(json.loads(raw))
    return sock, out


def test_an_unknown_model_gets_404_and_the_connection_closes(served: tuple[DemandWorld, str]) -> None:
    """One final line for a name no model serves."""
    _, path = served
    sock, lines = ask(path, b'{"model": "nope", "stream": false}\n')
    sock.close()
    assert lines == [{"status": 404, "message": "The model `nope` does not exist.", "retry_after_s": None}]


def test_a_held_request_gets_waiting_lines_then_ready(served: tuple[DemandWorld, str]) -> None:
    """While a waits: {"waiting", "queued"} lines; once the swap ran: {"ready": true} and the close."""
    dw, path = served
    sock, first = ask(path, b'{"model": "a", "stream": true}\n', replies=1)
    assert set(first[0]) == {"waiting", "queued"} and first[0]["queued"] == 1
    dw.run_swap()
    reader = sock.makefile("rb")
    rest = [json.loads(raw) for raw in iter(reader.readline, b"")]
    sock.close()
    assert rest[-1] == {"ready": True} and all("waiting" in r for r in rest[:-1])


def test_closing_the_connection_cancels_the_request(served: tuple[DemandWorld, str]) -> None:
    """The client went away: its ticket leaves the queue and nothing is started for it."""
    dw, path = served
    sock, _ = ask(path, b'{"model": "a"}\n', replies=1)
    assert dw.broker.snapshot()["queues"]["a"]["waiting"] == 1
    sock.close()
    wait_for(lambda: "a" not in dw.broker.snapshot()["queues"], timeout=10, what="the ticket cancelled")
    dw.broker.tick()
    assert dw.broker.running == {}
    assert dw.metric("orchestrator_demand_wait_seconds_count", model="a", outcome="cancelled") == 1


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b'{"model": 3}\n', b'{"model": "a", "extra": 1}\n', b'{"model": "a", "stream": "yes"}\n', b"[]\n"],
)
def test_a_malformed_request_gets_one_503_line_naming_it(served: tuple[DemandWorld, str], line: bytes) -> None:
    """Not the agreed line: one 503 naming what was expected; nothing queued."""
    dw, path = served
    sock, lines = ask(path, line)
    sock.close()
    assert len(lines) == 1 and lines[0]["status"] == 503 and "bad demand request" in lines[0]["message"]
    assert dw.broker.snapshot()["queues"] == {}


def test_a_peer_outside_the_allowed_users_is_refused(tmp_path: Path) -> None:
    """Only root, the agent's user and HAProxy's: any other uid gets a refusal before its line is read."""
    dw = DemandWorld(tmp_path)
    path = str(tmp_path / "demand.sock")
    server = DemandServer(path, dw.broker, uids={os.getuid() + 1})
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sock, lines = ask(path, b'{"model": "a"}\n')
        sock.close()
    finally:
        server.shutdown()
        server.server_close()
    assert len(lines) == 1 and lines[0]["status"] == 503 and "may not use the demand socket" in lines[0]["message"]
    assert dw.broker.snapshot()["queues"] == {}


def test_the_socket_is_not_open_to_everyone(served: tuple[DemandWorld, str]) -> None:
    """Mode 0660 (HAProxy's group) or 0600: never world-connectable."""
    _, path = served
    assert Path(path).stat().st_mode & 0o007 == 0


def test_an_agent_with_a_model_on_demand_runs_its_loops_and_socket(tmp_path: Path) -> None:
    """The agent opens its demand socket ([proxy] demand_socket) and runs the demand and idle loops;
    status shows them."""
    from orchestrator.agent.daemon import Agent

    from .conftest import OpsWorld

    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000, "demand_socket": str(tmp_path / "run" / "demand.sock")},
        models={"a": {"repo": "org/a", "gpus": [0], "port": 8001, "on_demand": True}},
    )
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    agent.demand.sync()
    try:
        assert {loop.name for loop in agent.demand.loops} == {"demand", "demand_idle"}
        assert agent.demand.server is not None
        assert Path(world.catalog.demand_socket()).is_socket()
        sock, lines = ask(world.catalog.demand_socket(), b'{"model": "zzz"}\n')
        sock.close()
        assert lines[0]["status"] == 404
        assert agent.info()["demand"]["hosts"]["box"]["swaps_last_min"] == 0
    finally:
        agent.stop()
        agent.demand.stop()


def test_an_agent_without_models_on_demand_opens_no_socket(tmp_path: Path) -> None:
    """No on-demand model: no socket, no extra loops, nothing in status."""
    from orchestrator.agent.daemon import Agent

    from .conftest import OpsWorld

    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000, "demand_socket": str(tmp_path / "run" / "demand.sock")},
    )
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    agent.demand.sync()
    assert agent.demand.server is None and not Path(world.catalog.demand_socket()).exists()
    assert "demand" not in agent.info() and agent.demand.loops == []
    assert {loop.name for loop in agent.loops} == {"schedules", "watch"}


def test_a_held_request_is_served_when_descriptors_pass_1024(served: tuple[DemandWorld, str]) -> None:
    """Hundreds of held requests take descriptors past select()'s FD_SETSIZE: still waiting lines, then ready."""
    dw, path = served
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        sock, first = ask(path, b'{"model": "a"}\n', replies=1)
        dw.run_swap()
        rest = [json.loads(raw) for raw in iter(sock.makefile("rb").readline, b"")]
        sock.close()
    finally:
        for fd in filler:
            os.close(fd)
    assert "waiting" in first[0] and rest[-1] == {"ready": True}


def test_an_operators_switch_waits_for_the_running_demand_swap_instead_of_busy(tmp_path: Path) -> None:
    """A demand swap runs: the operator's `switch b` through the agent waits for it, then runs (no Busy);
    the swap's request was answered ready before b took a's GPUs."""
    from orchestrator.agent.daemon import Agent

    from .conftest import OpsWorld

    world = OpsWorld(
        tmp_path / "state",
        proxy={"enabled": True, "port": 9000},
        models={
            "a": {"repo": "org/a", "gpus": [0], "port": 8001, "on_demand": True},
            "b": {"repo": "org/b", "gpus": [0], "port": 8002},
        },
    )
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    release, blocked = threading.Event(), threading.Event()

    def hold_the_start() -> None:
        if "start vllm-a.service" in world.host.calls and not release.is_set():
            blocked.set()
            release.wait(30)

    world.clock.on_sleep.append(hold_the_start)
    ticket = agent.broker.open("a")
    agent.broker.tick()
    assert blocked.wait(30), "the demand swap never reached its start"
    outcome: list[Any] = []
    operator = threading.Thread(target=lambda: outcome.append(agent._submit("switch", {"model": "b"}, "alice")))
    operator.start()
    wait_for(lambda: agent.broker.snapshot()["hosts"]["box"]["yielding_to"], timeout=10, what="the operator waiting")
    release.set()
    operator.join(30)
    job = outcome[0]
    assert job.done.wait(30) and (job.result or {}).get("result", {}).get("outcome") == "active", job.result
    assert ticket.answer == {"ready": True}  # answered as the demand swap ended, before b displaced a
    assert [d.trigger for d in world.store.history("box", 5)][:2] == ["alice", "demand:a"]


def test_waiting_lines_go_on_while_a_pass_holds_the_broker(served: tuple[DemandWorld, str]) -> None:
    """A slow pass holding the broker's lock does not silence the waiting lines (5 s of silence reads
    as a dead agent to the proxy)."""
    dw, path = served
    sock, _ = ask(path, b'{"model": "a"}\n', replies=1)
    reader = sock.makefile("rb")
    with dw.broker.lock:
        lines = [json.loads(reader.readline()) for _ in range(3)]
    sock.close()
    assert all("waiting" in line for line in lines)


def test_a_burst_of_connections_waits_in_the_backlog_while_the_agent_is_slow_to_accept(tmp_path: Path) -> None:
    """The proxy's Lua connects without blocking: 200 connections made before the agent accepts any (its
    accept thread starved on a loaded box) are all queued, none refused with EAGAIN (a held request's
    503 "the agent does not answer"); then each is answered."""
    world = DemandWorld(tmp_path)
    path = str(tmp_path / "demand.sock")
    server = DemandServer(path, world.broker, uids=[os.getuid()])  # listening, not accepting yet
    conns: list[socket.socket] = []
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        for _ in range(200):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.setblocking(False)
            conns.append(conn)
            conn.connect(path)  # BlockingIOError once the backlog is full
        serving.start()
        for conn in conns:
            conn.setblocking(True)
            conn.settimeout(10)
            conn.sendall(json.dumps({"model": "nope"}).encode() + b"\n")
        answers = [json.loads(conn.makefile("rb").readline()) for conn in conns]
        assert {a.get("status") for a in answers} == {404}
    finally:
        for conn in conns:
            conn.close()
        if serving.is_alive():
            server.shutdown()
        server.server_close()


def test_a_ready_answer_is_taken_once_the_proxy_closes_its_end(served: tuple[DemandWorld, str]) -> None:
    """The agent marks a ready request taken (HAProxy counts it from then) when the hold closes its end
    after reading the answer, not before."""
    dw, path = served
    taken: list[str] = []
    mark = dw.broker.taken
    dw.broker.taken = lambda t: (taken.append(t.model), mark(t))[1]  # type: ignore[method-assign]
    sock, _ = ask(path, b'{"model": "a"}\n', replies=1)
    dw.run_swap()
    reader = sock.makefile("rb")
    lines = [json.loads(raw) for raw in iter(reader.readline, b"")]
    assert lines[-1] == {"ready": True} and taken == []
    reader.close()
    sock.close()
    wait_for(lambda: taken == ["a"], timeout=10, what="the ready request marked taken")
