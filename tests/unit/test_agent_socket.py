"""The control socket against hostile and broken clients: a real agent socket in a temp dir, the
agent in this process over fake ports. Every request gets one clean reply; nothing escapes the
state directory; nothing leaves a traceback in the log."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import errors
from orchestrator.agent.daemon import Agent
from orchestrator.agent.server import ControlServer
from orchestrator.contract.ops import OPERATIONS
from orchestrator.contract.wire import MAX_REQUEST
from tests.hosts.wait import wait_for

from .conftest import OpsWorld


@dataclass
class Running:
    world: OpsWorld
    agent: Agent
    server: ControlServer
    path: str
    root: Path

    def send(self, data: bytes) -> list[dict[str, Any]]:
        """Send raw bytes, then read every reply line until the agent closes the connection."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(self.path)
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            with s.makefile("rb") as stream:
                return [json.loads(line) for line in stream]

    def request(self, obj: Any) -> list[dict[str, Any]]:
        return self.send(json.dumps(obj).encode() + b"\n")


def start(root: Path, max_connections: int = 32, io_timeout_s: float = 10.0) -> Running:
    world = OpsWorld(root / "state")
    agent = Agent(
        world.catalog, world.ops, socket=str(root / "state" / "agent.sock"), metrics_port=None, clock=world.clock
    )
    server = ControlServer(agent.socket, agent, max_connections=max_connections, io_timeout_s=io_timeout_s)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return Running(world, agent, server, agent.socket, root)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    r = start(tmp_path_factory.mktemp("agent"))
    yield r
    r.server.shutdown()
    r.server.server_close()


def files_outside_state(root: Path) -> set[str]:
    """Every path under root (and root's parent) that is not inside root/state."""
    inside = {str(p) for p in root.rglob("*") if not p.is_relative_to(root / "state")}
    return inside | {str(p) for p in root.parent.iterdir()}


def assert_clean(replies: list[dict[str, Any]]) -> None:
    assert replies, "no reply at all"
    *events, last = replies
    assert all(set(e) == {"event", "fields"} for e in events), events
    assert set(last) in ({"result"}, {"error"}), last
    if "error" in last:
        err = last["error"]
        cls = getattr(errors, err["type"], None)
        assert isinstance(cls, type) and issubclass(cls, errors.OrchestratorError), err
        assert isinstance(err["exit_code"], int) and "Traceback" not in err["message"], err


def assert_usage_error(replies: list[dict[str, Any]], *words: str) -> None:
    assert_clean(replies)
    err = replies[-1]["error"]
    assert (err["type"], err["exit_code"]) == ("UsageError", 2), err
    assert all(w in err["message"] for w in words), err["message"]


NASTY = ["../../x", "../../../x", "/etc/passwd", "alpha/../../x", "", "..", "alpha\n", "a" * 300, "box", "alpha"]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(NASTY),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
arg_names = st.sampled_from(["model", "host", "limit", "to_revision", "no_rollback", "force", "trigger"]) | st.text(
    max_size=8
)
requests = st.one_of(
    st.binary(max_size=200).map(lambda b: b + b"\n"),
    json_values.map(lambda v: json.dumps(v).encode() + b"\n"),
    st.fixed_dictionaries(
        {"op": st.sampled_from(sorted(OPERATIONS)) | json_values},
        optional={"args": st.dictionaries(arg_names, json_values, max_size=4) | json_values},
    ).map(lambda r: json.dumps(r).encode() + b"\n"),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=requests)
def test_every_generated_request_gets_one_clean_reply(running: Running, data: bytes) -> None:
    """Generated requests: a clean result or error each, no traceback logged, no file outside the state dir."""
    before = files_outside_state(running.root)
    with structlog.testing.capture_logs() as logs:
        replies = running.send(data)
    assert_clean(replies)
    assert not [e for e in logs if e.get("exc_info") or e["log_level"] in ("error", "critical")], logs
    assert files_outside_state(running.root) == before


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ({"op": "rollback", "args": {"host": "../../x"}}, ["unknown host '../../x'", "known: box"]),
        ({"op": "switch", "args": {}}, ["switch: argument model: Field required"]),
        ({"op": "switch"}, ["switch: argument model"]),
        ({"op": "switch", "args": [1]}, ["switch: args must be a JSON object, got [1]"]),
        ({"op": "history", "args": {"limit": "abc"}}, ["history: argument limit", "'abc'"]),
        ({"op": "history", "args": {"limit": 0}}, ["history: argument limit", "greater than or equal to 1"]),
        ({"op": "switch", "args": {"model": "alpha", "trigger": "cron:me"}}, ["argument trigger", "not permitted"]),
        ({"op": "stage", "args": {"model": "../../etc"}}, ["unknown model '../../etc'"]),
        ({"op": "reboot"}, ["unknown operation 'reboot'"]),
        ([1, 2], ["a JSON object with op and args expected"]),
    ],
)
def test_malformed_requests_get_a_usage_error(running: Running, request_: Any, words: list[str]) -> None:
    """Each request from the review is refused with one usage error naming the argument and value."""
    assert_usage_error(running.request(request_), *words)


def test_non_json_gets_a_usage_error(running: Running) -> None:
    """Bytes that are not JSON are answered, not dropped."""
    assert_usage_error(running.send(b"\xff\xfe not json\n"), "not JSON")


def test_an_oversized_request_is_refused_without_reading_it_all(running: Running) -> None:
    """A request past MAX_REQUEST without a newline is refused, and the agent stops reading there."""
    assert_usage_error(running.send(b"x" * (MAX_REQUEST + 10)), f"longer than {MAX_REQUEST} bytes")


def test_rollback_traversal_writes_no_lock_outside_the_state_dir(running: Running) -> None:
    """`rollback` with host ../../x creates no x.lock anywhere."""
    running.request({"op": "rollback", "args": {"host": "../../x"}})
    assert not (running.root / "x.lock").exists() and not (running.root.parent / "x.lock").exists()


def test_the_audit_trail_records_the_peer_not_the_client(running: Running) -> None:
    """A switch through the socket is recorded as the connecting uid's user at the socket."""
    import pwd

    replies = running.request({"op": "switch", "args": {"model": "beta"}})
    assert replies[-1]["result"]["trigger"] == f"{pwd.getpwuid(os.getuid()).pw_name}@socket"


FORGING_CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(json.dumps({"op": "switch", "args": {"model": sys.argv[2]}}).encode() + b"\\n")
s.shutdown(socket.SHUT_WR)
print(s.makefile().read().splitlines()[-1])
"""


def test_a_forged_ssh_connection_is_recorded_as_a_claim_not_as_fact(running: Running) -> None:
    """A local client whose own SSH_CONNECTION names 6.6.6.6 is recorded at the socket, the address only claimed."""
    import pwd
    import subprocess
    import sys

    env = {**os.environ, "SSH_CONNECTION": "6.6.6.6 4242 10.0.0.1 22"}
    done = subprocess.run(
        [sys.executable, "-c", FORGING_CLIENT, running.path, "gamma"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    trigger = json.loads(done.stdout)["result"]["trigger"]
    user = pwd.getpwuid(os.getuid()).pw_name
    assert trigger == f"{user}@socket (claims ssh from 6.6.6.6)"
    assert running.world.ops.store.history()[0].trigger == trigger


def test_a_client_that_hangs_up_mid_switch_logs_one_line(running: Running, capfd: pytest.CaptureFixture[str]) -> None:
    """A client gone during a streamed switch: the switch finishes; one log line, no traceback anywhere."""
    with structlog.testing.capture_logs() as logs:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(running.path)
            s.sendall(json.dumps({"op": "switch", "args": {"model": "gamma"}}).encode() + b"\n")
        wait_for(lambda: [e for e in logs if e["event"] == "client_detached"], what="the agent to see the hang-up")
        running.agent.jobs.join(timeout=30)
    assert running.world.store.serving("box").model == "gamma"
    assert [e["event"] for e in logs if e["event"] == "client_detached"] == ["client_detached"]
    assert not [e for e in logs if e.get("exc_info") or e["log_level"] in ("error", "critical")], logs
    assert "Traceback" not in capfd.readouterr().err


def test_connections_past_the_limit_are_turned_away(tmp_path: Path) -> None:
    """With every slot held by an idle client, the next one gets an agent error at once."""
    r = start(tmp_path, max_connections=2)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in idle:
            s.connect(r.path)
        replies = r.request({"op": "ping"})
        assert replies[-1]["error"]["type"] == "AgentError" and "2 connections" in replies[-1]["error"]["message"]
    finally:
        for s in idle:
            s.close()
        r.server.shutdown()
        r.server.server_close()


def test_a_request_past_the_documented_64_kib_is_refused(running: Running) -> None:
    """A well-formed request of 64 KiB + 1 byte is refused, naming the limit the docs give."""
    pad = 64 * 1024 - len(b'{"op":"ping","args":{"x":""}}')
    data = b'{"op":"ping","args":{"x":"' + b"a" * pad + b'"}}\n'
    assert len(data) == 64 * 1024 + 1
    assert_usage_error(running.send(data), "longer than 65536 bytes (64 KiB)")


def test_duplicate_keys_in_a_request_are_refused(running: Running) -> None:
    """{"op": "ping", "op": "switch"}: a usage error naming the key, not the last one winning."""
    assert_usage_error(running.send(b'{"op":"switch","op":"ping","args":{}}\n'), "duplicate key 'op'")
    assert_usage_error(running.send(b'{"op":"history","args":{"limit":1,"limit":2}}\n'), "duplicate key 'limit'")


def drip(sock: socket.socket, stop: threading.Event) -> None:
    """Send one byte every 50 ms, never a newline, until told to stop or the agent hangs up."""
    try:
        while not stop.wait(0.05):
            sock.sendall(b"x")
    except OSError:
        pass


def test_a_client_dripping_bytes_is_cut_off_at_the_overall_deadline(tmp_path: Path) -> None:
    """A request that never ends (a byte at a time) is answered with a usage error at the deadline."""
    r = start(tmp_path, io_timeout_s=1.0)
    stop = threading.Event()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(r.path)
            threading.Thread(target=drip, args=(s, stop), daemon=True).start()
            with s.makefile("rb") as stream:
                replies = [json.loads(line) for line in stream]
        assert_usage_error(replies, "not sent within 1 s")
    finally:
        stop.set()
        r.server.shutdown()
        r.server.server_close()


def test_a_turned_away_client_dripping_bytes_does_not_hold_its_slot(tmp_path: Path) -> None:
    """Past the connection limit, a client that keeps dripping bytes after its answer is hung up on:
    the next client over the limit is answered again instead of being dropped unanswered."""
    r = start(tmp_path, max_connections=1)
    stop = threading.Event()
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dripper = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        idle.connect(r.path)
        dripper.connect(r.path)
        threading.Thread(target=drip, args=(dripper, stop), daemon=True).start()

        def answered() -> bool:
            try:
                return r.request({"op": "ping"})[-1]["error"]["type"] == "AgentError"
            except (IndexError, KeyError, OSError):
                return False  # dropped without an answer: the dripper still holds the slot for answers

        wait_for(answered, what="a client past the limit to be answered again while another drips bytes")
    finally:
        stop.set()
        idle.close()
        dripper.close()
        r.server.shutdown()
        r.server.server_close()


def test_check_together_answers_the_host_or_refuses_naming_the_models(running: Running) -> None:
    """check_together (what a --host switch A B asks first): the host of one model; two models on a box
    without the front proxy, an unknown or an oversized name are a usage error saying which."""
    assert running.request({"op": "check_together", "args": {"models": ["alpha"]}})[-1] == {"result": {"host": "box"}}
    assert_usage_error(running.request({"op": "check_together", "args": {"models": ["alpha", "beta"]}}), "proxy")
    assert_usage_error(running.request({"op": "check_together", "args": {"models": ["x" * 300]}}), "models.0")
    assert_usage_error(running.request({"op": "check_together", "args": {"models": ["nope"]}}), "nope")
