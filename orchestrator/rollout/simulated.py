"""In-process stand-ins for a fleet's box agents: the controller's real code (fan-out, store,
decisions) against boxes that answer the agent's wire protocol over socket pairs, with a fake
network delay and a switch that takes ``switch_s``. The unit tests and bench/fleet/fleet_sim.py use them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.contract.wire import encode, error_reply
from orchestrator.core.states import Phase
from orchestrator.errors import OrchestratorError, TransportError, UsageError


class SimulatedBox(AgentClient):
    """One box: ``models`` (name -> repo) in its catalog, serving ``serving``; a switch to a model in
    ``failing`` is rolled back by its agent; ``hold`` (set by a test) blocks switches until set."""

    def __init__(
        self,
        name: str,
        models: dict[str, str],
        *,
        serving: str | None = None,
        failing: frozenset[str] = frozenset(),
        switch_s: float = 0.0,
        delay_s: float = 0.0,
        hold: threading.Event | None = None,
        preflight: bool = True,
        sickens: frozenset[str] = frozenset(),
    ) -> None:
        """``preflight``: False for an agent that predates that operation (it answers it as unknown);
        ``sickens``: models whose switch answers active but whose engine reads unhealthy right after."""
        super().__init__(f"{name}.sock")
        self.name, self.models, self.failing = name, dict(models), failing
        self.switch_s, self.delay_s, self.hold = switch_s, delay_s, hold
        self.serving = serving
        self.deployments: list[dict[str, Any]] = []  # newest last
        self.unreachable: OrchestratorError | None = None
        self.running: str | None = None
        self.lock = threading.Lock()
        self.open_channels = 0
        self.peak_channels = 0
        self.on_switch: Callable[[str], None] | None = None
        self.closed = False
        self.dropped = False  # its connection died with lose(): dead until close()
        self.preflight = preflight
        self.sickens = sickens
        self.healthy = True
        self.asked: list[str] = []  # the operation of each request, in the order they arrived
        self.args: list[dict[str, Any]] = []  # and its arguments
        if serving is not None:
            self._record(serving, "active")

    def close(self) -> None:
        """What a remote client does at the end: its SSH connection closes (the next use opens another)."""
        self.closed = True
        self.dropped = False

    def lose(self) -> None:
        """The box drops off the network: new channels fail, a channel in flight ends unanswered (the
        box's agent finishes what it runs, as a real one does), and the connection stays dead once the
        box is back, as an SSH connection does, until the client is closed and connects again."""
        self.unreachable = TransportError(f"host {self.name}: SSH connection lost (simulated)")
        self.dropped = True

    def come_back(self) -> None:
        self.unreachable = None

    def ended(self, op: str, stream: Any) -> OrchestratorError:
        return self.unreachable or super().ended(op, stream)

    def switches(self, model: str) -> int:
        """Deployments of ``model`` this box made (the rollout must make exactly one)."""
        return sum(1 for d in self.deployments if d["model"] == model)

    def _record(self, model: str, outcome: str) -> dict[str, Any]:
        dep = {
            "id": len(self.deployments) + 1,
            "model": model,
            "outcome": outcome,
            "revision": len(self.deployments) + 1,
            "previous_revision": self.deployments[-1]["revision"] if self.deployments else None,
            "created_at": time.time(),
            "ended_at": time.time(),
            "bench": None,
            "error": None,
        }
        self.deployments.append(dep)
        return dep

    # -- the wire ---------------------------------------------------------------------------------
    def open_stream(self) -> Any:
        if self.unreachable is not None:
            raise self.unreachable
        if self.dropped:
            raise TransportError(f"host {self.name}: the SSH connection closed (simulated)")
        time.sleep(self.delay_s)  # opening a channel: the relay's exec, one round trip
        ours, agent = socket.socketpair()
        with self.lock:
            self.open_channels += 1
            self.peak_channels = max(self.peak_channels, self.open_channels)
        threading.Thread(target=self._serve, args=(agent,), name=f"sim-{self.name}", daemon=True).start()
        return ours

    def _serve(self, agent: socket.socket) -> None:
        try:
            with agent, agent.makefile("rb") as stream:
                request = json.loads(stream.readline())
                with self.lock:
                    self.asked.append(str(request["op"]))
                    self.args.append(dict(request.get("args") or {}))
                time.sleep(self.delay_s)  # the network: one round trip before the agent sees the request
                try:
                    for item in self._answer(str(request["op"]), dict(request.get("args") or {})):
                        if self.unreachable is not None and "result" in item:
                            return  # lost meanwhile: the answer never reaches the controller
                        agent.sendall(encode(item))
                except OrchestratorError as exc:
                    agent.sendall(encode(error_reply(exc)))
        except OSError:
            pass  # the controller went away: a real agent carries on too
        finally:
            with self.lock:
                self.open_channels -= 1

    def _answer(self, op: str, args: dict[str, Any]) -> Any:
        if op == "preflight" and self.preflight:
            yield {"result": {part: self._one(part, args) for part in ("config_show", "status", "history")}}
        elif op == "config_show":
            text = "".join(f'[models.{m}]\nrepo = "{r}"\n' for m, r in self.models.items())
            yield {"result": {"text": text, "path": "/etc/orchestrator/deploy.toml", "revision": 1}}
        elif op == "status":
            serving = (
                {"model": self.serving, "revision": self.deployments[-1]["revision"], "healthy": self.healthy}
                if self.serving
                else None
            )
            running = {self.name: self.running} if self.running else {}
            yield {"result": {"hosts": {self.name: {"serving": serving, "running": []}}, "agent": {"running": running}}}
        elif op == "history":
            yield {"result": list(reversed(self.deployments))[: int(args.get("limit") or 20)]}
        elif op == "stage":
            yield {"result": {"model": args["model"], "staged": True}}
        elif op == "switch":
            yield from self._switch(str(args["model"]))
        elif op == "rollback":
            previous = next((d["model"] for d in reversed(self.deployments[:-1]) if d["outcome"] == Phase.ACTIVE), None)
            if previous is not None:
                self.serving, self.healthy = previous, True
            yield {"result": {"outcome": "active", **self._record(previous or "nothing", "active")}}
        elif op == "follow":
            yield {"result": {"followed": []}}
        elif op == "preflight":
            raise UsageError(f"unknown operation {op!r}: op must be one of config_show, history, status, ...")
        else:
            raise TransportError(f"simulated box {self.name}: no operation {op!r}")

    def _one(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """One part of a preflight answer: what ``op`` alone answers (its result, or its error)."""
        try:
            *_, last = self._answer(op, {"limit": 1} if op == "history" else args)
        except OrchestratorError as exc:
            return error_reply(exc)
        return dict(last)

    def _switch(self, model: str) -> Any:
        self.running = "switch"
        try:
            if self.on_switch is not None:
                self.on_switch(self.name)
            yield {"event": "phase", "fields": {"phase": "starting", "model": model}}
            if self.hold is not None:
                self.hold.wait()
            time.sleep(self.switch_s)
            if model in self.failing:
                dep = self._record(model, "rolled_back")
            else:
                dep = self._record(model, "active")
                self.serving = model
                self.healthy = model not in self.sickens
        finally:
            self.running = None
        yield {"result": {"id": dep["id"], "outcome": dep["outcome"], "model": model, "error": None}}
