"""`orchestrator rollout`: switch a group model across its boxes, canary first, then in batches.

The controller only orchestrates: each box switches itself through its own agent (stage, switch,
rollback are the agent's operations, with its own state machine, lock and recovery), and the
controller records each host's state in its rollout store before it acts on the next one. A
controller that dies leaves every box either untouched, or with an agent that finishes its switch;
`rollout resume` reads both and never switches a host twice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.client.targets import Target
from orchestrator.core import rollout as core
from orchestrator.core.catalog import Catalog, Host, Model
from orchestrator.core.rollout import HostState, Rollout, RolloutStatus
from orchestrator.errors import Busy, OrchestratorError, RolloutPaused, TransportError, UsageError
from orchestrator.ports import Clock
from orchestrator.ports import RolloutStore as RolloutRecord
from orchestrator.rollout.fanout import HostRequest, run_all
from orchestrator.rollout.preflight import check_boxes, refuse
from orchestrator.rollout.store import RolloutStore

Report = Callable[[str, str, dict[str, Any]], None]  # host, event, fields
AfterBatch = Callable[[int], None]  # called after each batch has switched (tests hold the controller here)
Driven = Callable[[Rollout], bool]  # whether a live controller drives this rollout now


def remote_client(host: Host) -> AgentClient:
    from orchestrator.client.remote import RemoteAgentClient

    return RemoteAgentClient(Target.of_host(host))


class Fleet:
    def __init__(
        self,
        catalog: Catalog,
        *,
        connect: Callable[[Host], AgentClient] = remote_client,
        report: Report | None = None,
        store: RolloutRecord | None = None,
        after_batch: AfterBatch | None = None,
        clock: Clock | None = None,
        pid: int | None = None,
        started_by: str | None = None,
        driven: Driven | None = None,
        on_start: Callable[[int], None] | None = None,
        starting: AbstractContextManager[Any] | None = None,
    ) -> None:
        """``pid``: the controller's (this process, or the agent that drives rollouts); ``driven``:
        how this controller tells a live rollout from one whose controller died (default: its pid
        runs orchestrator); ``on_start``: told the new rollout's id once it is recorded."""
        self.catalog = catalog
        self.after_batch = after_batch
        self.connect = connect
        self.report = report or (lambda h, e, f: None)
        self.store: RolloutRecord = store or RolloutStore(
            Path(catalog.state_dir) / "rollouts.db", group=catalog.socket_group
        )
        self.clock = clock or _system_clock()
        self.pid = os.getpid() if pid is None else pid
        self.started_by = started_by
        self.driven: Driven = driven or (lambda ro: ro.pid == self.pid or process_alive(ro.pid))
        self.on_start = on_start
        self.starting = starting or nullcontext()  # the last overlap check and the record as one step
        self.clients: dict[str, AgentClient] = {}  # one per box for the whole rollout, closed by close()

    def close(self) -> None:
        for client in self.clients.values():
            closer = getattr(client, "close", None)
            if closer is not None:
                closer()
        self.clients.clear()

    def _run_all(self, calls: list[HostRequest], on_event: Report | None = None) -> dict[str, Any]:
        """run_all, then the client of each host the way to which failed is closed and forgotten: its
        connection may be dead (an SSH connection does not come back), so the next request connects anew."""
        results = run_all(calls, on_event)
        for host, result in results.items():
            if isinstance(result, TransportError):
                client = self.clients.pop(host, None)
                closer = getattr(client, "close", None)
                if closer is not None:
                    closer()
        return results

    def _clients(self, hosts: list[str]) -> dict[str, AgentClient]:
        for h in hosts:
            if h not in self.clients:
                self.clients[h] = self.connect(self.catalog.hosts[h])
        return {h: self.clients[h] for h in hosts}

    # -- starting ---------------------------------------------------------------------------------
    def rollout(
        self,
        model_name: str,
        *,
        group: str | None = None,
        canary: int | None = None,
        batch: int | None = None,
        max_failures: int | None = None,
        rollback_all: bool = False,
    ) -> dict[str, Any]:
        model, group_name = self._target(model_name, group)
        grp = self.catalog.groups[group_name]
        policy = core.Policy(
            canary=grp.canary if canary is None else canary,
            batch=batch or grp.batch,
            max_failures=grp.max_failures if max_failures is None else max_failures,
            rollback_all=rollback_all,
        )
        batches = core.plan(list(grp.hosts), policy.canary, policy.batch)
        self._no_overlap(group_name, grp.hosts)
        views = check_boxes(self._clients(list(grp.hosts)), model)
        with self.starting:
            self._no_overlap(group_name, grp.hosts)  # again: another client may have started one meanwhile
            rid = self.store.create(
                model.name,
                group_name,
                policy,
                grp.gate,
                batches,
                self.pid,
                started_by=self.started_by,
                at=self.clock.now(),
            )
            if self.on_start is not None:
                self.on_start(rid)
        self.store.set_hosts(rid, {host: {"baseline_id": view.baseline_id} for host, view in views.items()})
        for host, view in views.items():
            self.report(
                host, "rollout_host", {"batch": _batch_of(batches, host), "state": "pending", "serving": view.serving}
            )
        if model.source != "none":
            self._stage(rid, model, [h for b in batches for h in b], grp.seed)
        return self._drive(rid)

    def _target(self, model_name: str, group: str | None) -> tuple[Model, str]:
        model = self.catalog.model(model_name)
        name = group or model.group
        if name is None:
            raise UsageError(
                f"model {model_name!r} targets no group: give --group G or set group in [models.{model_name}]"
            )
        if name not in self.catalog.groups:
            known = ", ".join(sorted(self.catalog.groups)) or "none"
            raise UsageError(f"unknown group {name!r} (known: {known})")
        return model, name

    def _no_overlap(self, group: str, hosts: tuple[str, ...]) -> None:
        """One rollout at a time per group and per box: a second one is refused naming the first."""
        for ro in self.store.unfinished():
            shared = sorted(set(hosts) & {r.host for r in self.store.hosts(ro.id)})
            if shared or ro.group == group:
                who = f", started by {ro.started_by}" if ro.started_by else ""
                where = f"on {', '.join(shared)}" if shared else f"on group {group}"
                if self.driven(ro):  # still running: resuming it is not for this client to do
                    raise Busy(
                        f"rollout #{ro.id} ({ro.model} on group {ro.group}{who}) is still running {where} "
                        f"(its controller, pid {ro.pid}, drives it): wait for it to end (`orchestrator "
                        "rollout status --follow`) or stop it (`orchestrator rollout abort`), then start "
                        "again"
                    )
                raise Busy(
                    f"rollout #{ro.id} ({ro.model} on group {ro.group}{who}) has not finished {where} and "
                    "nothing drives it: `orchestrator rollout resume` or `orchestrator rollout abort` first"
                )

    def _stage(self, rid: int, model: Model, order: list[str], seed: str | None) -> None:
        """Every host stages before any stops: the seed from the hub, the others from the seed."""
        first = seed or order[0]
        clients = self._clients(order)
        self.report(first, "rollout_host", {"state": "staging", "detail": "from the hub"})
        done = self._run_all([HostRequest(first, clients[first], "stage", {"model": model.name})], self._event)
        others = [h for h in order if h != first]
        if not isinstance(done[first], OrchestratorError):
            peer = self._peer_of(first)
            for h in others:
                self.report(h, "rollout_host", {"state": "staging", "detail": f"from {first}"})
            done |= self._run_all(
                [HostRequest(h, clients[h], "stage", {"model": model.name, "peer": peer}) for h in others], self._event
            )
        errors = {h: r for h, r in done.items() if isinstance(r, OrchestratorError)}
        if errors:
            self.store.finish(rid, RolloutStatus.FAILED, f"staging failed on {', '.join(errors)}", self.clock.now())
            raise refuse(errors, "staging")
        self.store.set_hosts(rid, {h: {"state": HostState.STAGED} for h in order})
        for h in order:
            self.report(h, "rollout_host", {"state": "staged"})

    def _peer_of(self, name: str) -> dict[str, Any]:
        host = self.catalog.hosts[name]
        grp = next(g for g in self.catalog.groups.values() if name in g.hosts)
        return {
            "name": name,
            "address": host.address,
            "port": host.ssh_port,
            "user": host.ssh_user,
            "root": host.models_dir,
            "key_file": grp.peer_key,
            "known_hosts": grp.peer_known_hosts,
        }

    # -- driving ----------------------------------------------------------------------------------
    def _drive(self, rid: int, *, rollback_all: bool | None = None) -> dict[str, Any]:
        while True:
            ro = self.store.get(rid)
            policy = (
                ro.policy
                if rollback_all is None
                else core.Policy(ro.policy.canary, ro.policy.batch, ro.policy.max_failures, rollback_all)
            )
            decision = core.decide(self.store.hosts(rid), policy, has_canary=ro.canary > 0, aborted=ro.abort_requested)
            if decision.kind == "wait":
                self._settle(ro, decision.hosts)
            elif decision.kind == "switch":
                self._switch(ro, decision.hosts)
                self._gate(ro, decision.hosts)
                if self.after_batch is not None and decision.batch is not None:
                    self.after_batch(decision.batch)
            elif decision.kind == "stop":
                self._revert(ro, decision.revert)
                status = RolloutStatus.ABORTED if ro.abort_requested else RolloutStatus.FAILED
                self.store.finish(rid, status, decision.reason, self.clock.now())
                return self.summary(rid)
            else:
                self.store.finish(rid, RolloutStatus.SUCCEEDED, None, self.clock.now())
                return self.summary(rid)

    def _event(self, host: str, event: str, fields: dict[str, Any]) -> None:
        self.report(host, event, fields)

    def _switch(self, ro: Rollout, hosts: tuple[str, ...]) -> None:
        clients = self._clients(list(hosts))
        # the whole batch recorded switching (one commit) before any of its switches is sent
        self.store.set_hosts(ro.id, {h: {"state": HostState.SWITCHING, "switched_at": self.clock.now()} for h in hosts})
        for h in hosts:
            self.report(h, "rollout_host", {"state": "switching"})
        results = self._run_all(
            [HostRequest(h, clients[h], "switch", {"model": ro.model, "rollout": _label(ro)}) for h in hosts],
            self._event,
        )
        lost = [h for h, r in results.items() if isinstance(r, TransportError)]
        ended = {h: self._ended(r) for h, r in results.items() if h not in lost}
        self.store.set_hosts(ro.id, ended)  # the batch's answers, one commit, before the next step
        for h, fields in ended.items():
            self._reported(h, fields)
        if lost:  # its agent carries on; only a controller that sees the box again may say how it ended
            raise RolloutPaused(
                f"rollout #{ro.id} paused: lost {', '.join(lost)} mid-switch (its agent "
                f"carries on); `orchestrator rollout resume` once it answers again",
                rollout=ro.id,
                lost=lost,
            )

    def _record(self, ro: Rollout, host: str, result: Any) -> None:
        fields = self._ended(result)
        self.store.set_host(ro.id, host, **fields)
        self._reported(host, fields)

    def _ended(self, result: Any) -> dict[str, Any]:
        """The host fields a box's switch answer (or error) records."""
        if isinstance(result, OrchestratorError):
            fields: dict[str, Any] = {"state": HostState.FAILED, "error": str(result).splitlines()[0]}
        elif result.get("noop"):
            fields = {"state": HostState.SWITCHED, "outcome": "noop"}
        else:
            fields = {
                "state": core.state_of_outcome(str(result["outcome"])),
                "outcome": result["outcome"],
                "deployment_id": result.get("id"),
                "error": result.get("error"),
            }
        return {**fields, "ended_at": self.clock.now()}

    def _reported(self, host: str, fields: dict[str, Any]) -> None:
        self.report(
            host,
            "rollout_host",
            {"state": str(fields["state"]), "outcome": fields.get("outcome"), "error": fields.get("error")},
        )

    def _settle(self, ro: Rollout, hosts: tuple[str, ...]) -> None:
        """After a restart: hosts recorded as switching are followed, recorded, or (never reached) re-sent."""
        records = {r.host: r for r in self.store.hosts(ro.id)}
        clients = self._clients(list(hosts))
        status = self._run_all([HostRequest(h, clients[h], "status", {"host": None}) for h in hosts])
        history = self._run_all([HostRequest(h, clients[h], "history", {"host": None, "limit": 20}) for h in hosts])
        bad = {h: r for h in hosts for r in (status[h], history[h]) if isinstance(r, OrchestratorError)}
        if bad and all(isinstance(r, TransportError) for r in bad.values()):
            raise RolloutPaused(
                f"rollout #{ro.id} paused: cannot reach {', '.join(bad)}, recorded switching "
                f"({_first_line(next(iter(bad.values())))}); it goes on once "
                f"{'they answer' if len(bad) > 1 else 'it answers'} again",
                rollout=ro.id,
                lost=list(bad),
            )
        if bad:
            raise refuse(bad, "resume could not see every box that was switching")
        follow: list[str] = []
        for h in hosts:
            ours = [d for d in history[h] if d["model"] == ro.model and d["id"] > (records[h].baseline_id or 0)]
            busy = bool((status[h].get("agent") or {}).get("running"))
            newest = ours[0] if ours else None
            entry: dict[str, Any] = next(iter((status[h].get("hosts") or {}).values()), {})
            serving = (entry.get("serving") or {}).get("model")
            observed = core.Observed(
                busy=busy,
                ours=newest["outcome"] if newest else None,
                ours_ended=bool(newest and newest.get("ended_at")),
                serves_ours=serving == ro.model,
            )
            action = core.resume_action(records[h], observed)
            self.report(h, "rollout_host", {"state": "switching", "detail": f"resume: {action}"})
            if action == "follow":
                follow.append(h)
            elif action == "record" and newest is not None:
                self._record(ro, h, newest)
            elif action == "superseded" and newest is not None:
                error = (
                    f"deployment #{newest['id']} of {ro.model} became active, but the box serves "
                    f"{serving or 'nothing'} now (switched by another operation since)"
                )
                self.store.set_host(
                    ro.id,
                    h,
                    state=HostState.FAILED,
                    outcome="superseded",
                    deployment_id=newest["id"],
                    error=error,
                    ended_at=self.clock.now(),
                )
                self.report(h, "rollout_host", {"state": "failed", "outcome": "superseded", "error": error})
            elif action == "switch":
                self.store.set_host(ro.id, h, state=HostState.STAGED)
        if follow:
            self._run_all([HostRequest(h, clients[h], "follow", {"host": None}) for h in follow], self._event)

    def _gate(self, ro: Rollout, hosts: tuple[str, ...]) -> None:
        """Between batches: each host switched in this batch serves the model, healthy (and fast enough).
        Each is asked now, not taken from its switch answer: an engine that passed its health check and
        then died (out of memory at its first real batch) is what a gate is there to catch."""
        if ro.gate == "none":
            return
        switched = [r.host for r in self.store.hosts(ro.id) if r.host in hosts and r.state is HostState.SWITCHED]
        if not switched:
            return
        clients = self._clients(switched)
        status = self._run_all([HostRequest(h, clients[h], "status", {"host": None}) for h in switched])
        history = (
            self._run_all([HostRequest(h, clients[h], "history", {"host": None, "limit": 20}) for h in switched])
            if ro.gate == "bench"
            else {}
        )
        failing: dict[str, str] = {}
        for h in switched:
            why = self._gate_one(ro, status[h], history.get(h))
            if why is not None:
                failing[h] = why
        if not failing:
            return
        back = self._run_all(
            [HostRequest(h, clients[h], "rollback", {"host": None, "rollout": _label(ro)}) for h in failing],
            self._event,
        )
        for h, why in failing.items():
            outcome = None if isinstance(back[h], OrchestratorError) else back[h].get("outcome")
            self.store.set_host(ro.id, h, state=HostState.FAILED, outcome=outcome, error=f"gate: {why}")
            self.report(h, "rollout_host", {"state": "failed", "error": f"gate: {why}"})

    def _gate_one(self, ro: Rollout, status: Any, history: Any) -> str | None:
        if isinstance(status, OrchestratorError):
            return f"status: {status}"
        entry: dict[str, Any] = next(iter((status.get("hosts") or {}).values()), {})
        serving: dict[str, Any] = entry.get("serving") or {}
        tok_s = previous = None
        if history is not None and not isinstance(history, OrchestratorError) and history:
            tok_s = (history[0].get("bench") or {}).get("headline_tok_s")
            prev_rev = history[0].get("previous_revision")
            prev = next((d for d in history if d["revision"] == prev_rev), None)
            previous = ((prev or {}).get("bench") or {}).get("headline_tok_s")
        ratio = self.catalog.policy.min_tok_s_ratio if ro.gate == "bench" else None
        return core.gate_failure(
            model=ro.model,
            serving=serving.get("model"),
            healthy=serving.get("healthy"),
            tok_s=tok_s,
            previous_tok_s=previous,
            min_ratio=ratio,
        )

    def _revert(self, ro: Rollout, hosts: tuple[str, ...]) -> None:
        if not hosts:
            return
        clients = self._clients(list(hosts))
        for h in hosts:
            self.report(h, "rollout_host", {"state": "reverting"})
        back = self._run_all(
            [HostRequest(h, clients[h], "rollback", {"host": None, "rollout": _label(ro)}) for h in hosts], self._event
        )
        for h, r in back.items():
            if isinstance(r, OrchestratorError):
                self.store.set_host(ro.id, h, error=f"revert: {str(r).splitlines()[0]}")
                self.report(h, "rollout_host", {"state": "switched", "error": f"revert failed: {r}"})
            else:
                self.store.set_host(ro.id, h, state=HostState.REVERTED, outcome=r.get("outcome"))
                self.report(h, "rollout_host", {"state": "reverted", "outcome": r.get("outcome")})

    # -- resume, abort, status --------------------------------------------------------------------
    def _unfinished(self, rid: int | None) -> Rollout:
        if rid is not None:
            ro = self.store.get(rid)
            if ro.status is not RolloutStatus.RUNNING:
                raise UsageError(f"rollout #{rid} has already ended ({ro.status.value})")
            return ro
        open_ = self.store.unfinished()
        if not open_:
            raise UsageError(f"no unfinished rollout in {self.store.path}")
        return open_[-1]

    def resume(self, rid: int | None = None) -> dict[str, Any]:
        ro = self._unfinished(rid)
        if self.driven(ro):
            raise Busy(
                f"rollout #{ro.id} is still driven by controller pid {ro.pid}; abort it with "
                "`orchestrator rollout abort`"
            )
        self.store.take_over(ro.id, self.pid)
        return self._drive(ro.id)

    def drive(self, rid: int, *, rollback_all: bool | None = None) -> dict[str, Any]:
        """Drive a recorded rollout as its controller now (the caller made sure no other one does)."""
        self.store.take_over(rid, self.pid)
        return self._drive(rid, rollback_all=rollback_all)

    def abort(self, rid: int | None = None, *, rollback_all: bool = False) -> dict[str, Any]:
        """Stop starting batches; a live controller stops after its batch, a dead one's rollout ends here
        (in-flight switches are followed to their end first)."""
        ro = self._unfinished(rid)
        self.store.request_abort(ro.id)
        if self.driven(ro):
            return {
                **self.summary(ro.id),
                "message": f"abort requested: the controller (pid {ro.pid}) stops after its running batch",
            }
        self.store.take_over(ro.id, self.pid)
        return self._drive(ro.id, rollback_all=rollback_all or None)

    def summary(self, rid: int | None = None) -> dict[str, Any]:
        ro = self.store.get(rid) if rid is not None else self.store.latest()
        if ro is None:
            raise UsageError(f"no rollout recorded in {self.store.path}")
        times = self.store.host_times(ro.id)
        hosts = [
            {
                "host": r.host,
                "batch": r.batch,
                "state": r.state.value,
                "deployment_id": r.deployment_id,
                "outcome": r.outcome,
                "error": r.error,
                "switched_at": times[r.host][0],
                "ended_at": times[r.host][1],
            }
            for r in self.store.hosts(ro.id)
        ]
        shown = ro.to_dict()
        alive = self.driven(ro)
        shown["controller"] = {"pid": ro.pid, "alive": alive}
        if ro.status is RolloutStatus.RUNNING and not alive:
            # recorded as running, but nothing drives it: its controller died (kill -9, a lost machine)
            shown["status"] = "interrupted"
            shown["reason"] = (
                f"its controller (pid {ro.pid}) is gone; `orchestrator rollout resume` finishes it, "
                "`orchestrator rollout abort` ends it"
            )
        return {"rollout": shown, "hosts": hosts}


def _label(ro: Rollout) -> str:
    """What each box records with the switches and rollbacks of this rollout, beside the controller's login."""
    who = "".join(ch for ch in ro.started_by or "" if ch.isprintable())[:150]
    return f"rollout #{ro.id}" + (f" by {who}" if who else "")


def _first_line(exc: OrchestratorError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _batch_of(batches: list[tuple[str, ...]], host: str) -> int:
    return next(i for i, b in enumerate(batches) if host in b)


def process_alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live orchestrator process (a CLI or an agent that drives a rollout)."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"orchestrator" in cmdline


def _system_clock() -> Clock:
    from orchestrator.adapters.clock import SystemClock

    return SystemClock()
