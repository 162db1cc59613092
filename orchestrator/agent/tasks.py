"""What the agent does on its own: fire due schedules, watch what serves and act on policy.

Each ``tick`` is one pass over the Clock port's time; the decisions themselves are the pure
functions of ``core.schedule`` and ``core.watch``. A failure on one host is recorded and the pass
goes on with the next host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator import errors, logs
from orchestrator.agent.controller import own_hosts
from orchestrator.agent.loops import Failures
from orchestrator.agent.metrics import Metrics
from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Catalog
from orchestrator.core.watch import hold_off, judge, judge_revival
from orchestrator.deploy.operations import Operations
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.ports import Clock

log = logs.get_logger()

Submit = Callable[[str, dict[str, Any], str], Any]  # (op, args, trigger) -> the job; raises if refused
Busy = Callable[[str], object]


class ScheduleTask:
    def __init__(
        self, catalog: Catalog, ops: Operations, clock: Clock, submit: Submit, next_runs: dict[str, float] | None = None
    ) -> None:
        """``next_runs``: as the agent's loadout computed them (else computed here, from now)."""
        self.catalog, self.ops, self.clock, self.submit = catalog, ops, clock, submit
        self.next_runs = dict(next_runs) if next_runs is not None else sched.first_runs(catalog.schedules, clock.now())

    def reload(self, catalog: Catalog, ops: Operations, next_runs: dict[str, float]) -> None:
        """A pushed deploy.toml: its schedules replace these, from now on."""
        self.catalog, self.ops, self.next_runs = catalog, ops, dict(next_runs)

    def tick(self) -> float:
        """Fire what is due; return the seconds until the next one (at most 30, to notice clock jumps)."""
        now = self.clock.now()
        for name, at in sched.due(self.next_runs, now):
            nxt = sched.after_firing(self.catalog.schedules[name], at, now)
            if nxt is None:  # its last fire time: done, never due again
                del self.next_runs[name]
            else:
                self.next_runs[name] = nxt
            self.fire(name, at)
        nxt = min(self.next_runs.values(), default=now + 30.0)
        return max(0.05, min(nxt - self.clock.now(), 30.0))

    def fire(self, name: str, at: float) -> None:
        s = self.catalog.schedules[name]
        host = self.catalog.target(s.model, s.host).name
        detail: dict[str, Any] = {"schedule": name, "action": s.action, "model": s.model, "due": at}
        if not sched.in_window(s, self.clock.now()):
            self.ops.record_event(self.clock.now(), host, "schedule_skipped", {**detail, "reason": "outside window"})
            return
        try:
            if s.action == "redeploy":
                serving = self.ops.serving(host)
                if serving is None:
                    raise UsageError(f"host {host} serves nothing to redeploy")
                job = self.submit("switch", {"model": serving.model, "force": True}, f"schedule:{name}")
            else:
                job = self.submit(s.action, {"model": s.model}, f"schedule:{name}")
        except errors.Busy as exc:
            if s.on_busy == "skip":  # the one choice: a queued switch could fire hours late, outside its window
                self._skipped(name, host, {**detail, "on_busy": s.on_busy}, exc)
                return
            raise
        except OrchestratorError as exc:
            self._skipped(name, host, detail, exc)
            return
        self.ops.record_event(self.clock.now(), host, "schedule_fired", detail)
        log.info("schedule_fired", schedule=name, host=host, op=job.op)

    def _skipped(self, name: str, host: str, detail: dict[str, Any], exc: OrchestratorError) -> None:
        self.ops.record_event(self.clock.now(), host, "schedule_skipped", {**detail, "reason": str(exc)})
        log.info("schedule_skipped", schedule=name, host=host, reason=str(exc))


class WatchTask:
    def __init__(
        self,
        catalog: Catalog,
        ops: Operations,
        clock: Clock,
        submit: Submit,
        busy: Busy,
        metrics: Metrics,
        failures: Failures,
    ) -> None:
        self.catalog, self.ops, self.clock, self.submit, self.busy = catalog, ops, clock, submit, busy
        self.metrics, self.failures = metrics, failures
        self.unhealthy_since: dict[str, float] = {}
        self.healthy_at: dict[str, float] = {}  # the last healthy reading of what serves, by host
        self.holding: dict[str, str] = {}  # why the watch holds off, logged once per hold
        # (host, failed revision): why-not said, revival submitted; each once per failed switch.
        self.said: set[tuple[str, int]] = set()
        self.tried: set[tuple[str, int]] = set()

    def tick(self) -> float:
        for host in own_hosts(self.catalog):  # not a controller's fleet hosts: their own agents watch them
            try:
                self.check(host)
            except Exception as exc:  # noqa: BLE001 - the agent's top loop: one host must not skip the rest
                self.failures.failed("watch", host, exc)
            else:
                self.failures.ok("watch", host)
        return self.catalog.policy.watch_interval_s

    def check(self, host: str) -> None:
        if self.busy(host):
            self.unhealthy_since.pop(host, None)  # an operation owns the host; judge afresh after it
            return
        self.revive(host)
        serving, healthy, unit = self.ops.probe(host)  # TransportError: cannot look, which is not unhealthy
        if serving is None:
            self.unhealthy_since.pop(host, None)
            return
        self.metrics.healthy(host, healthy)
        policy, now = self.catalog.policy, self.clock.now()
        if healthy:
            self.healthy_at[host] = now
        # A deployment that ended serving passed its health checks then: the engine had loaded.
        seen = max((t for t in (self.healthy_at.get(host), serving.ended_at) if t is not None), default=None)
        held = None if unit is None else hold_off(unit, now, serving.spec.load_deadline_s, seen)
        verdict = judge(self.unhealthy_since.get(host), healthy, now, policy.unhealthy_after_s, held)
        if verdict.since is None:
            self.unhealthy_since.pop(host, None)
        else:
            self.unhealthy_since[host] = verdict.since
        self._held(host, serving.model, held if verdict.unhealthy_s >= policy.unhealthy_after_s else None)
        if not verdict.act:
            return
        detail = {
            "model": serving.model,
            "revision": serving.revision,
            "action": policy.on_unhealthy,
            "unhealthy_s": round(verdict.unhealthy_s, 1),
        }
        self.ops.record_event(self.clock.now(), host, "unhealthy", detail)
        log.warning("model_unhealthy", host=host, **detail)
        try:
            if policy.on_unhealthy == "restart":
                self.submit("switch", {"model": serving.model, "force": True}, "watch:restart")
            elif policy.on_unhealthy == "rollback":
                self.submit("rollback", {"host": host}, "watch")
        except OrchestratorError as exc:
            self.ops.record_event(self.clock.now(), host, "watch_action_failed", {"error": str(exc)})

    def _held(self, host: str, model: str, why: str | None) -> None:
        """An unhealthy engine left alone while it loads: logged when the hold begins."""
        if why is None:
            self.holding.pop(host, None)
        elif host not in self.holding:
            self.holding[host] = why
            log.info("watch_holding_off", host=host, model=model, reason=why)

    def revive(self, host: str) -> None:
        """A failed switch whose rollback failed too left a name answering 503: wake what served it
        once its memory is back (a warm switch, recorded like any), and say why not until then."""
        lost = self.ops.lost(host)
        if lost is None:
            return
        key = (host, lost.failed.revision)
        verdict = judge_revival(lost.blockers, said=key in self.said, tried=key in self.tried)
        detail = {"model": lost.model.model, "revision": lost.model.revision, "failed_revision": lost.failed.revision}
        if verdict.say:
            self.said.add(key)
            self.ops.record_event(self.clock.now(), host, "revive_waiting", {**detail, "reasons": list(lost.blockers)})
            log.warning("revive_waiting", host=host, reasons=list(lost.blockers), **detail)
        if not verdict.act:
            return
        self.tried.add(key)
        self.ops.record_event(self.clock.now(), host, "revive", detail)
        log.info("revive", host=host, **detail)
        try:
            self.submit("switch", {"model": lost.model.model}, "watch:revive")
        except errors.Busy:
            self.tried.discard(key)  # another operation took the host first: look again next pass
        except OrchestratorError as exc:
            self.ops.record_event(self.clock.now(), host, "watch_action_failed", {"error": str(exc), **detail})
