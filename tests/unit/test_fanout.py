"""The fleet fan-out (rollout/fanout.py): channels to the boxes open concurrently, bounded, and the
results come back in the order of the calls with each host's error named."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest

from orchestrator.client.backends import AgentClient
from orchestrator.contract.wire import encode, error_reply
from orchestrator.errors import AgentError, Busy, OrchestratorError, TransportError
from orchestrator.rollout import fanout
from orchestrator.rollout.fanout import HostRequest, run_all
from orchestrator.rollout.preflight import refuse


class FakeBox(AgentClient):
    """A box whose agent answers ``reply`` (a result, or an error) once its channel is open; opening
    waits at ``gate`` (a barrier every box must reach) and may raise ``open_error`` instead."""

    def __init__(
        self,
        name: str,
        reply: Any = None,
        *,
        gate: threading.Barrier | None = None,
        open_error: OrchestratorError | None = None,
        after: tuple[FakeBox, ...] = (),
    ) -> None:
        super().__init__(f"{name}.sock")
        self.name, self.reply, self.gate, self.open_error, self.after = name, reply, gate, open_error, after
        self.requests: list[dict[str, Any]] = []
        self.sent = threading.Event()
        self._peers: list[socket.socket] = []

    def open_stream(self) -> Any:
        if self.gate is not None:
            self.gate.wait()  # raises BrokenBarrierError unless every box is opening at the same time
        if self.open_error is not None:
            raise self.open_error
        ours, agent = socket.socketpair()
        self._peers.append(agent)
        threading.Thread(target=self._answer, args=(agent,), daemon=True).start()
        return ours

    def _answer(self, agent: socket.socket) -> None:
        with agent.makefile("rb") as stream:
            self.requests.append(json.loads(stream.readline()))
        for other in self.after:  # answer only once those boxes have answered
            other.sent.wait()
        reply = error_reply(self.reply) if isinstance(self.reply, OrchestratorError) else {"result": self.reply}
        agent.sendall(encode(reply))
        agent.close()
        self.sent.set()


def test_opens_run_concurrently() -> None:
    """Eight boxes' channels are open at the same moment (a barrier of 8 passes), each sent its request."""
    gate = threading.Barrier(8, timeout=30)
    boxes = [FakeBox(f"b{i}", i, gate=gate) for i in range(8)]
    results = run_all([HostRequest(b.name, b, "status", {"host": None}) for b in boxes])
    assert results == {f"b{i}": i for i in range(8)}
    assert all(b.requests == [{"op": "status", "args": {"host": None}}] for b in boxes)


def test_opens_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With OPEN_WORKERS 2, three boxes never open at once: a barrier of 3 breaks, naming each host."""
    monkeypatch.setattr(fanout, "OPEN_WORKERS", 2)
    gate = threading.Barrier(3, timeout=2)
    boxes = [FakeBox(f"b{i}", i, gate=gate) for i in range(3)]
    with pytest.raises(threading.BrokenBarrierError):
        run_all([HostRequest(b.name, b, "status") for b in boxes])


def test_results_and_errors_come_back_in_call_order() -> None:
    """A reply that arrives last and a box that cannot be reached still come back in call order; the
    refusal names every bad host in that order with the first one's exit code."""
    c, d = FakeBox("c", {"ok": True}), FakeBox("d", AgentError("agent at d.sock: no model 'x'"))
    boxes = [
        FakeBox("a", Busy("busy: switch on a"), after=(c, d)),
        FakeBox("b", open_error=TransportError("host b (10.0.0.2:22): connection refused")),
        c,
        d,
    ]
    results = run_all([HostRequest(b.name, b, "config_show") for b in boxes])
    assert list(results) == ["a", "b", "c", "d"]
    assert results["c"] == {"ok": True}
    errors = {h: r for h, r in results.items() if isinstance(r, OrchestratorError)}
    err = refuse(errors, "unreachable or without an agent")
    assert isinstance(err, Busy) and err.exit_code == Busy("x").exit_code
    text = str(err)
    assert text.index("a: busy") < text.index("b: host b") < text.index("d: agent at d.sock")


def test_group_history_in_plain_text_prints_each_deployment_and_each_unreachable_host() -> None:
    """history --group: a deployment record (its "error" None) is a deployment line, not "unreachable:
    None"; a box that cannot be reached is one line naming why; the JSON is valid (no Infinity)."""
    from orchestrator.cli.rollout_cmds import group_history_lines
    from orchestrator.rollout.group_view import group_history

    dep = {
        "revision": 3,
        "model": "alpha",
        "outcome": "active",
        "trigger": "root@10.0.0.7",
        "error": None,
        "created_at": 1_700_000_000.0,
    }
    boxes = {"h1": FakeBox("h1", [dep]), "h2": FakeBox("h2", open_error=TransportError("host h2: connection refused"))}
    rows = group_history(boxes, 10)
    lines = group_history_lines(rows)
    assert lines[0] == "h2           unreachable: host h2: connection refused"
    assert lines[1].endswith("h1           #3   alpha            active      root@10.0.0.7")
    assert json.loads(json.dumps(rows, allow_nan=False)) == rows
