"""Models on demand, the data path: a real HAProxy on loopback, from the rendered config and the
shipped Lua, holds a request for a model with no usable server, asks a scripted agent on a real Unix
socket, then routes it or answers the agent's error; the agent gone or silent is a 503, never a hang."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator.adapters import haproxy_master
from orchestrator.adapters.haproxy import _MASTER_CLI
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import OldWorker, Procs, draining, mark_commands, parse_show_proc
from orchestrator.core.proxy import DEMAND_LUA, DemandRoute, Route
from orchestrator.resources import template_text
from tests.builders.haproxy import Engine, free_port, haproxy, render_front
from tests.builders.haproxy import post as haproxy_post
from tests.builders.toml import LOCAL_PROXY_BOX
from tests.hosts.wait import wait_for

from .cli_runner import invoke

RETRY_AFTER_S = 4


@dataclass
class Held:
    """One connection the proxy opened to the agent: what it asked, and when it closed its end."""

    ask: dict[str, object]
    finals: list[float] = field(default_factory=list)  # when the final line was sent
    closed: threading.Event = field(default_factory=threading.Event)


Script = Callable[["Conn"], None]


class Conn:
    """The agent's side of one held request, for a script to answer on."""

    def __init__(self, sock: socket.socket, held: Held) -> None:
        self.sock, self.held = sock, held

    def send(self, obj: dict[str, object]) -> bool:
        try:
            self.sock.sendall(json.dumps(obj).encode() + b"\n")
        except OSError:
            self.held.closed.set()
            return False
        return True

    def wait(self, seconds: float) -> bool:
        """Waiting lines every 0.2 s for ``seconds``; False once the proxy closed its end."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.peer_closed(0.2) or not self.send({"waiting": 0.2, "queued": 1}):
                return False
        return True

    def final(self, obj: dict[str, object]) -> None:
        self.held.finals.append(time.monotonic())
        self.send(obj)

    def peer_closed(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        try:
            if readable and not self.sock.recv(4096):
                self.held.closed.set()
        except ConnectionResetError:  # the proxy closed with our waiting lines unread: a reset, not an EOF
            self.held.closed.set()
        return self.held.closed.is_set()


class Agent:
    """A scripted demand socket: per model, what to answer; every connection is recorded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.scripts: dict[str, Script] = {}
        self.held: list[Held] = []
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(str(path))
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            line = sock.makefile("rb").readline()
            held = Held(json.loads(line))
            self.held.append(held)
            conn = Conn(sock, held)
            self.scripts[str(held.ask["model"])](conn)
            while not conn.peer_closed(1.0):  # until the proxy closes its end
                pass

    def asked(self, model: str) -> list[Held]:
        return [h for h in self.held if h.ask["model"] == model]

    def close(self) -> None:
        self.listener.close()
        self.path.unlink(missing_ok=True)


@dataclass
class Front:
    port: int
    engine: Engine
    agent: Agent
    master: subprocess.Popen[bytes]
    cfg: Path
    render: Callable[[list[Route]], str]
    master_sock: Path
    alpha: int  # alpha's engine port (nothing listens: only the drain looks at it)


def _workers(master: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], check=False, capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("demand")
    engine = Engine().start()
    eport = engine.port
    agent = Agent(tmp / "demand.sock")
    port = free_port()
    lua = template_text(DEMAND_LUA)
    (tmp / DEMAND_LUA).write_text(lua)
    demand = [
        DemandRoute(name, "127.0.0.1", eport, 2.0 if name == "brief" else 60.0)
        for name in ("beta", "brief", "awake", "gapped")
    ]

    def render(routes: list[Route]) -> str:
        # drain_timeout_s 1: a reload's old worker would be ended (hard-stop-after) 1 s after, but for the holds.
        return render_front(
            tmp,
            Proxy(enabled=True, port=port, retry_after_s=RETRY_AFTER_S, drain_timeout_s=1),
            routes,
            demand=demand,
            demand_socket=str(agent.path),
            lua=lua,
        )

    cfg = tmp / "haproxy.cfg"
    alpha = free_port()
    cfg.write_text(render([Route("alpha", "127.0.0.1", alpha), Route("awake", "127.0.0.1", eport), Route("gapped")]))
    master_sock = tmp / "master.sock"
    with haproxy(cfg, port, master_sock=master_sock) as master:
        yield Front(port, engine, agent, master, cfg, render, master_sock, alpha)
    engine.close()
    agent.close()


def post(
    port: int, model: str, *, stream: bool | None = None, timeout: float = 30
) -> tuple[int, dict[str, str], bytes]:
    return haproxy_post(port, model, timeout=timeout, **({} if stream is None else {"stream": stream}))


def ready_after(seconds: float) -> Script:
    def script(conn: Conn) -> None:
        if conn.wait(seconds):
            conn.final({"ready": True})

    return script


def ready_when(release: threading.Event) -> Script:
    def script(conn: Conn) -> None:
        while not release.is_set():
            if not conn.wait(0.2):
                return
        conn.final({"ready": True})

    return script


def answer(obj: dict[str, object]) -> Script:
    def script(conn: Conn) -> None:
        conn.wait(0.3)
        conn.final(obj)

    return script


def test_held_then_routed(front: Front) -> None:
    """A request for a model with no usable server waits for the agent's ready, then reaches its engine."""
    front.agent.scripts["beta"] = ready_after(0.6)
    status, _, _ = post(front.port, "beta")
    assert status == 200
    [held] = front.agent.asked("beta")
    assert held.ask == {"model": "beta", "stream": False}
    reached = [a.at for a in front.engine.seen if a.model == "beta"]
    assert len(reached) == 1 and reached[0] > held.finals[0]  # it reached the engine only after "ready"
    wait_for(held.closed.is_set, what="the proxy closing the agent's connection after ready")


def test_a_hold_outlasts_luas_session_timeout(front: Front) -> None:
    """A stream held 5 s (longer than HAProxy's 4 s Lua session timeout) is still routed;
    the agent learns it streams."""
    front.agent.scripts["beta"] = ready_after(5.0)
    before = len(front.agent.asked("beta"))
    assert post(front.port, "beta", stream=True)[0] == 200
    assert front.agent.asked("beta")[before].ask == {"model": "beta", "stream": True}


def test_429_passes_through_with_retry_after(front: Front) -> None:
    """The agent's 429 reaches the client with its Retry-After and message, in OpenAI's error shape."""
    message = 'queue of "beta" is full (64 waiting) \u2014 retry later'
    front.agent.scripts["beta"] = answer({"status": 429, "message": message, "retry_after_s": 7})
    seen = len(front.engine.seen)
    status, headers, body = post(front.port, "beta")
    assert status == 429 and headers["retry-after"] == "7"
    error = json.loads(body)["error"]
    assert error["message"] == message and error["code"] == "model_queue_full"
    assert len(front.engine.seen) == seen


def test_503_without_retry_after_uses_the_proxys(front: Front) -> None:
    """A 503 whose retry_after_s is null gets [proxy] retry_after_s as Retry-After."""
    front.agent.scripts["beta"] = answer({"status": 503, "message": "deadline passed", "retry_after_s": None})
    status, headers, body = post(front.port, "beta")
    assert status == 503 and headers["retry-after"] == str(RETRY_AFTER_S)
    assert json.loads(body)["error"] == {
        "message": "deadline passed",
        "type": "service_unavailable",
        "param": "model",
        "code": "model_unavailable",
    }


def test_agents_404_is_model_not_found(front: Front) -> None:
    """The agent's 404 (it will not serve that model) is OpenAI's model_not_found, without Retry-After."""
    front.agent.scripts["beta"] = answer(
        {"status": 404, "message": "beta is not on demand here", "retry_after_s": None}
    )
    status, headers, body = post(front.port, "beta")
    assert status == 404 and "retry-after" not in headers
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_client_disconnect_closes_the_agents_connection(front: Front) -> None:
    """A client that gives up while held makes the proxy close its connection to the agent;
    nothing reaches the engine."""
    front.agent.scripts["beta"] = ready_after(3600)
    before = len(front.agent.asked("beta"))
    seen = len(front.engine.seen)
    with pytest.raises(TimeoutError):
        post(front.port, "beta", timeout=1.0)
    held = wait_for(lambda: front.agent.asked("beta")[before:], what="the held request at the agent")[0]
    wait_for(held.closed.is_set, timeout=10, what="the proxy closing the agent's connection")
    assert not held.finals and len(front.engine.seen) == seen


def held_now(front: Front) -> int:
    """Requests the current worker holds now (its demand_held table's conn_cur)."""
    table = haproxy_master.ask(str(front.master_sock), "@1 show table demand_held") or ""
    return sum(int(f.split("=", 1)[1]) for f in table.split() if f.startswith("conn_cur="))


def test_a_held_request_outlives_the_agents_restart(front: Front) -> None:
    """The agent's connection closing before its final line (the agent killed, systemd restarting it):
    the hold asks again, and the new agent's answer routes the request."""
    calls: list[int] = []

    def dies_once(conn: Conn) -> None:
        calls.append(1)
        if len(calls) == 1:
            conn.wait(0.3)
            conn.sock.shutdown(socket.SHUT_RDWR)
        else:
            ready_after(0.3)(conn)

    front.agent.scripts["beta"] = dies_once
    status, _, body = post(front.port, "beta")
    assert status == 200, body
    assert len(calls) == 2


def test_a_held_request_waits_for_an_agent_that_is_not_listening_yet(front: Front) -> None:
    """No agent on the socket for a moment (between the old one's death and the new one's start): the
    hold tries again until one listens, then that one answers it."""
    front.agent.listener.close()
    front.agent.path.unlink()
    path = front.agent.path
    answered: dict[str, tuple[int, dict[str, str], bytes]] = {}
    client = threading.Thread(target=lambda: answered.update(r=post(front.port, "beta")), daemon=True)
    client.start()
    wait_for(lambda: held_now(front) >= 1, what="the request held with no agent listening")
    front.agent = Agent(path)
    front.agent.scripts["beta"] = ready_after(0.2)
    client.join(30)
    status, _, body = answered["r"]
    assert status == 200, body


def test_agent_closing_without_an_answer_is_503(front: Front) -> None:
    """An agent that closes every connection before its final line: 503 with Retry-After, at the
    hold's deadline at the latest (here 2 s: the agent's restart window is longer)."""
    front.agent.scripts["brief"] = lambda conn: conn.sock.shutdown(socket.SHUT_RDWR)
    before = len(front.agent.asked("brief"))
    status, headers, body = post(front.port, "brief")
    assert status == 503 and headers["retry-after"] == str(RETRY_AFTER_S)
    assert str(front.agent.path) in json.loads(body)["error"]["message"]
    assert len(front.agent.asked("brief")) - before > 1  # asked again while it might be restarting


@pytest.mark.parametrize("gone", ["stopped listening", "socket file removed"])
def test_agent_gone_is_503_by_the_deadline(front: Front, gone: str) -> None:
    """No agent on the socket (its file left behind, or removed) for the whole hold: 503 with
    Retry-After naming the socket, at the hold's deadline at the latest."""
    front.agent.listener.close()
    if gone == "socket file removed":
        front.agent.path.unlink()
    try:
        # the hold's deadline (2 s) ends it, not the agent's restart window (15 s, past this timeout)
        status, headers, body = post(front.port, "brief", timeout=10)
    finally:
        front.agent.path.unlink(missing_ok=True)
        front.agent = Agent(front.agent.path)
    assert status == 503 and headers["retry-after"] == str(RETRY_AFTER_S)
    assert str(front.agent.path) in json.loads(body)["error"]["message"]


def test_no_final_answer_within_the_deadline_is_503(front: Front) -> None:
    """An agent that only ever says "waiting": the proxy ends the hold at the model's deadline with a 503."""
    front.agent.scripts["brief"] = ready_after(3600)
    status, headers, body = post(front.port, "brief")
    assert status == 503 and headers["retry-after"] == str(RETRY_AFTER_S)
    assert "within" in json.loads(body)["error"]["message"]
    wait_for(front.agent.asked("brief")[-1].closed.is_set, what="the proxy closing the agent's connection")


def test_a_model_on_demand_being_switched_is_held_not_503(front: Front) -> None:
    """A name on demand in a stop-start gap is held until ready instead of answering model_switching."""
    front.agent.scripts["gapped"] = ready_after(0.3)
    assert post(front.port, "gapped")[0] == 200
    assert len(front.agent.asked("gapped")) == 1


def test_a_serving_model_on_demand_is_not_held(front: Front) -> None:
    """A model on demand that has a usable server goes straight to it: the agent is never asked."""
    assert post(front.port, "awake")[0] == 200
    assert not front.agent.asked("awake")


def test_unknown_name_is_404_and_asks_nothing(front: Front) -> None:
    """A name neither served nor on demand keeps its 404 model_not_found; the agent is never asked."""
    status, _, body = post(front.port, "nobody")
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    assert not front.agent.asked("nobody")


def _old_workers(front: Front, *commands: str) -> tuple[Procs | None, dict[int, OldWorker]]:
    """What the adapter asks the master CLI before a drain counts old workers (its own script), after
    sending ``commands`` (the drain's marks)."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _MASTER_CLI, "master", str(front.master_sock), "old", *commands],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    answer = json.loads(out)
    return parse_show_proc(answer["proc"] or ""), {
        int(pid): OldWorker(int(pid), v["info"], v["stat"], v["marks"]) for pid, v in answer["old"].items()
    }


def test_the_master_cli_answers_the_same_in_process_and_as_a_script(front: Front) -> None:
    """The agent on its own box asks the master CLI in its process; over SSH the same module runs as a
    script: both give the same workers."""
    script = json.loads(
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", _MASTER_CLI, "master", str(front.master_sock), "proc"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    here = haproxy_master.master(str(front.master_sock), "proc", [])
    in_process, by_script = parse_show_proc(here["proc"]), parse_show_proc(script["proc"])
    assert in_process is not None and by_script is not None and in_process.workers == by_script.workers


def test_a_reload_during_the_hold_keeps_the_held_request(front: Front) -> None:
    """The agent's swap reloads the proxy while a request is held: once the drain marked the displaced
    engine's backend, it does not wait for the held client (no request in flight there), and the old
    worker, kept past drain_timeout_s for its hold, routes it on ready."""
    release = threading.Event()
    front.agent.scripts["beta"] = ready_when(release)
    before = len(front.agent.asked("beta"))
    eport = front.engine.server_address[1]
    result: list[int] = []
    client = threading.Thread(target=lambda: result.append(post(front.port, "beta")[0]))
    client.start()
    held = wait_for(lambda: front.agent.asked("beta")[before:], what="the held request at the agent")[0]
    old = _workers(front.master.pid)
    # The swap: beta takes alpha's place; alpha's engine is drained before it sleeps.
    front.cfg.write_text(
        front.render([Route("awake", "127.0.0.1", eport), Route("beta", "127.0.0.1", eport), Route("gapped")])
    )
    os.kill(front.master.pid, signal.SIGUSR2)
    wait_for(lambda: _workers(front.master.pid) - old, what="a worker of the new config")
    alpha = [("127.0.0.1", front.alpha)]
    procs, workers = wait_for(
        lambda: _old_workers(front),
        lambda pw: (
            pw[0] is not None
            and pw[0].old_workers
            and all(w.info and w.stat for w in pw[1].values())
            and mark_commands(pw[1], alpha)
        ),
        what="the old worker's answers, stopping",
    )
    procs, workers = _old_workers(front, *mark_commands(workers, alpha))
    assert procs is not None
    assert draining(procs, workers, alpha) == 0
    assert post(front.port, "beta")[0] == 200  # the new worker routes beta without a hold
    assert len(front.agent.asked("beta")) == before + 1
    reloaded = time.monotonic()
    wait_for(lambda: time.monotonic() - reloaded > 2.0, what="past drain_timeout_s (hard-stop-after) since the reload")
    release.set()
    client.join(30)
    assert result == [200] and held.finals


def _render_cli(tmp_path: Path, extra: str = "") -> tuple[int, str]:
    (tmp_path / "state").mkdir(exist_ok=True)
    path = LOCAL_PROXY_BOX.write(
        tmp_path,
        state=str(tmp_path / "state"),
        defaults="load_deadline_s = 40",
        beta_gpus="[0, 1]",
        beta="on_demand = true",
        rest=extra,
    )
    result = invoke("render", "--proxy", "--config", str(path))
    return result.exit_code, result.output


def test_render_proxy_shows_the_hold_for_a_model_on_demand(tmp_path: Path) -> None:
    """Nothing serves: the model on demand has a disabled backend, the hold (its cold deadline + margin),
    and is listed."""
    code, out = _render_cli(tmp_path)
    assert code == 0, out
    assert f'lua-load "/etc/orchestrator/{DEMAND_LUA}"' in out
    assert (
        'http-request lua.demand_hold "/run/orchestrator/demand.sock" 44 5 if { method POST } '
        '{ var(txn.model) -m str "beta" } { nbsrv(m1) eq 0 }'
    ) in out
    assert 'server engine "127.0.0.1:8020" disabled' in out
    assert '{"id":"beta","object":"model"' in out and '{"id":"alpha"' not in out  # alpha: neither serving nor on demand


def test_two_models_on_demand_with_one_served_name_are_refused(tmp_path: Path) -> None:
    """Two models on demand served as one name: exit 2 naming both and the name (a ready could not say which;
    the catalog refuses it, and render_host would too)."""
    code, out = _render_cli(
        tmp_path,
        '[models.gamma]\nrepo = "org/g"\ngpus = [4, 5]\ntensor_parallel = 2\n'
        'port = 8030\non_demand = true\nserved_name = "beta"\n',
    )
    assert code == 2 and "beta" in out and "gamma" in out and "'beta'" in out, out
