"""The fleet controller: rollouts as jobs of one agent, not of the CLI that asked for them.

Any agent whose deploy.toml has groups is a controller. A rollout runs in a thread of this agent
(rollout/fleet.py, the same code as an in-CLI rollout) and reaches the group's agents with this
agent's SSH identity (the hosts' ``ssh_key`` and ``known_hosts`` in its deploy.toml); clients only
start, follow, abort or resume it, so a client that goes away detaches and nothing else. Every step
is recorded in <state_dir>/rollouts.db first, so an agent that restarts resumes each unfinished
rollout and never switches a host twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from orchestrator.agent.server import _DONE, Job
from orchestrator.client.backends import AgentClient
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.contract.wire import error_reply
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.rollout import Rollout
from orchestrator.errors import AgentError, Busy, OrchestratorError, RolloutPaused, UsageError
from orchestrator.ports import Clock
from orchestrator.ports import RolloutStore as RolloutRecord
from orchestrator.rollout.fleet import AfterBatch, Fleet, process_alive, remote_client

log = structlog.get_logger()

# How often a rollout paused on a lost box tries that box again (it goes on once the box answers).
RETRY_S = 10.0

# Set only by code that embeds the agent (the tests' entry point holds the controller between batches
# with it); no flag or environment variable reaches it.
after_batch_hook: AfterBatch | None = None


def own_hosts(catalog: Catalog) -> list[str]:
    """The hosts this agent owns (watches, recovers, reports in its metrics): every host but those it
    reaches only as its fleet's controller, the group hosts over SSH, whose own agents own them."""
    grouped = {h for g in catalog.groups.values() for h in g.hosts}
    return [n for n, h in catalog.hosts.items() if n not in grouped or h.transport == "local"]


class FleetController:
    def __init__(
        self,
        catalog: Callable[[], Catalog],
        *,
        clock: Clock,
        pid: int,
        store: RolloutRecord | None = None,
        connect: Callable[[Host], AgentClient] = remote_client,
        after_batch: AfterBatch | None = None,
        stopping: threading.Event | None = None,
        retry_s: float = RETRY_S,
        alive: Callable[[int | None], bool] = process_alive,
    ) -> None:
        """``stopping``: the agent's (a paused rollout stops retrying then; its restart resumes it);
        ``alive``: whether the process a rollout is recorded with (a CLI running one itself) still runs."""
        self.catalog, self.clock, self.pid, self.connect = catalog, clock, pid, connect
        self.alive = alive
        self.stopping, self.retry_s = stopping or threading.Event(), retry_s
        self.paused: dict[int, str] = {}  # rollouts waiting for a lost box, with why (guarded by lock)
        self.after_batch = after_batch or after_batch_hook
        self._store = store
        self.runs: dict[int, Job] = {}  # the rollouts this agent drives now
        self.lock = threading.Lock()  # guards runs
        self.starting = threading.Lock()  # one start at a time: the overlap check and the record are one step
        self.threads: list[threading.Thread] = []
        self.observers: list[Callable[[Job], None]] = []  # told of each rollout job before it runs (the dashboard)

    @property
    def store(self) -> RolloutRecord:
        if self._store is None:  # opened on first use: an agent that never controls keeps no rollouts.db
            from orchestrator.rollout.store import RolloutStore

            cat = self.catalog()
            self._store = RolloutStore(Path(cat.state_dir) / "rollouts.db", group=cat.socket_group)
        return self._store

    def _fleet(
        self, job: Job | None, started_by: str | None = None, on_start: Callable[[int], None] | None = None
    ) -> Fleet:
        def report(host: str, event: str, fields: dict[str, Any]) -> None:
            if job is not None:
                job.publish({"event": event, "fields": {**fields, "group_host": host}})

        return Fleet(
            self.catalog(),
            connect=self.connect,
            report=report,
            store=self.store,
            after_batch=self.after_batch,
            clock=self.clock,
            pid=self.pid,
            started_by=started_by,
            driven=self._driven,
            on_start=on_start,
            starting=self.starting,
        )

    def _driven(self, ro: Rollout) -> bool:
        """Driven here, or by the live process it is recorded with (a CLI that runs it itself); a
        rollout recorded by an earlier run of this agent is driven only once resumed here."""
        return ro.id in self.runs or (ro.pid != self.pid and self.alive(ro.pid))

    def _is_controller(self) -> None:
        """An agent whose deploy.toml has no groups drives no rollout: say so, not "unknown group"."""
        if not self.catalog().groups:
            raise UsageError(
                f"the agent (pid {self.pid}) that answered is not a fleet controller: its deploy.toml "
                "has no [groups.*]; reach the controller (--host CTL, or ORCHESTRATOR_SOCKET at its "
                "socket), or unset both to run the rollout in this CLI"
            )

    # -- starting and driving -------------------------------------------------------------------
    def start(self, args: RolloutStartArgs, started_by: str | None) -> dict[str, Any]:
        """Preflight and record here (refusals go back to the caller), then drive in the background."""
        self._is_controller()
        job = Job("controller", "rollout_start", args.model_dump())
        recorded = threading.Event()
        rid: list[int] = []
        failed: list[OrchestratorError] = []

        def on_start(new: int) -> None:
            rid.append(new)
            with self.lock:
                self.runs[new] = job
            recorded.set()

        def body(fleet: Fleet) -> dict[str, Any]:
            return fleet.rollout(
                args.model,
                group=args.group,
                canary=args.canary,
                batch=args.batch,
                max_failures=args.max_failures,
                rollback_all=args.rollback_all,
            )

        self._spawn(
            job, lambda: self._driving(self._fleet(job, started_by, on_start), job, body), rid, failed, recorded
        )
        recorded.wait()
        if failed:
            raise failed[0]
        return {"id": rid[0], **self.summary(rid[0])}

    def resume(self, rid: int | None) -> dict[str, Any]:
        self._is_controller()
        ro = self._fleet(None)._unfinished(rid)
        with self.lock:
            if ro.id in self.runs:
                raise Busy(
                    f"rollout #{ro.id} is already driven by this controller (agent pid {self.pid}): "
                    "follow it with `orchestrator rollout status --follow`"
                )
            if self._driven(ro):
                raise Busy(
                    f"rollout #{ro.id} is still driven by pid {ro.pid} (a CLI that runs it itself): "
                    "let it finish, or `orchestrator rollout abort` it"
                )
            job = Job("controller", "rollout_resume", {"id": ro.id})
            self.runs[ro.id] = job
        self._spawn(
            job, lambda: self._driving(self._fleet(job), job, lambda f: f.drive(ro.id)), [ro.id], [], threading.Event()
        )
        return {"id": ro.id, **self.summary(ro.id)}

    def abort(self, rid: int | None, rollback_all: bool) -> dict[str, Any]:
        """A driven rollout stops after its running batch; one nothing drives ends here, in the background."""
        self._is_controller()
        fleet = self._fleet(None)
        ro = fleet._unfinished(rid)
        with self.lock:
            driven = self._driven(ro)
            self.store.request_abort(ro.id)
            if not driven:
                job = Job("controller", "rollout_abort", {"id": ro.id})
                self.runs[ro.id] = job
        if driven:
            who = f"agent pid {self.pid}" if ro.id in self.runs else f"pid {ro.pid}"
            return {
                **self.summary(ro.id),
                "message": f"abort requested: the controller ({who}) stops after its running batch",
            }
        self._spawn(
            job,
            lambda: self._driving(self._fleet(job), job, lambda f: f.drive(ro.id, rollback_all=rollback_all or None)),
            [ro.id],
            [],
            threading.Event(),
        )
        return {**self.summary(ro.id), "message": "abort requested: ending it now"}

    def resume_unfinished(self) -> None:
        """At agent start: every rollout recorded as running is driven again (resume never switches twice)."""
        cat = self.catalog()
        if self._store is None and not (Path(cat.state_dir) / "rollouts.db").exists():
            return
        for ro in self.store.unfinished():
            log.info("rollout_resumed", rollout=ro.id, model=ro.model, group=ro.group)
            try:
                self.resume(ro.id)
            except OrchestratorError as exc:
                log.warning("rollout_resume_failed", rollout=ro.id, error=str(exc))

    def _spawn(
        self,
        job: Job,
        body: Callable[[], dict[str, Any]],
        rid: list[int],
        failed: list[OrchestratorError],
        recorded: threading.Event,
    ) -> None:
        for observe in list(self.observers):
            observe(job)

        def run() -> None:
            try:
                job.result = {"result": body()}
            except OrchestratorError as exc:
                log.warning("rollout_stopped", rollout=rid[0] if rid else None, error=str(exc))
                failed.append(exc)
                job.result = error_reply(exc)
            except Exception as exc:  # the agent's top loop: a crashed rollout must not take the agent
                log.exception("rollout_crashed", rollout=rid[0] if rid else None)
                failed.append(AgentError(f"the rollout crashed: {exc!r}"))
                job.result = error_reply(failed[-1])
            finally:
                with self.lock:
                    if rid:
                        self.runs.pop(rid[0], None)
                job.done.set()
                job.publish(_DONE)
                recorded.set()

        thread = threading.Thread(target=run, name="rollout", daemon=True)
        self.threads.append(thread)
        thread.start()

    def _driving(self, fleet: Fleet, job: Job, body: Callable[[Fleet], dict[str, Any]]) -> dict[str, Any]:
        """``body``, then, while a box it needs is lost, the rollout paused: driven again every retry_s
        until that box answers (what it did meanwhile is read from it, never switched twice); the
        channels to the boxes are closed at the end."""
        rid: int | None = None
        try:
            try:
                return body(fleet)
            except RolloutPaused as exc:
                paused = exc
            while True:
                rid = paused.rollout
                with self.lock:
                    self.paused[rid] = str(paused)
                log.warning("rollout_paused", rollout=rid, lost=paused.lost, retry_s=self.retry_s)
                job.publish(
                    {
                        "event": "rollout_paused",
                        "fields": {"rollout": rid, "lost": paused.lost, "reason": str(paused), "retry_s": self.retry_s},
                    }
                )
                if self.stopping.wait(self.retry_s):
                    raise paused  # the agent stops: the rollout stays recorded; its restart resumes it
                try:
                    return fleet.drive(rid)
                except RolloutPaused as again:
                    paused = again
        finally:
            if rid is not None:
                with self.lock:
                    self.paused.pop(rid, None)
            fleet.close()

    # -- watching -------------------------------------------------------------------------------
    def summary(self, rid: int | None) -> dict[str, Any]:
        if rid is None:
            self._is_controller()  # a rollout asked for by id may be an old one, from when it had groups
        out = self._fleet(None).summary(rid)
        ro = out["rollout"]
        if ro["id"] in self.runs:
            ro["controller"] = {"pid": self.pid, "alive": True, "agent": True}
        # else the fleet's: the process it is recorded with, and whether it runs (a CLI driving it)
        with self.lock:
            why = self.paused.get(ro["id"])
        if why is not None and ro["status"] == "running":
            ro["status"] = "paused"
            ro["reason"] = (
                f"{why.split('; ')[0]}; the controller (agent pid {self.pid}) tries again every "
                f"{self.retry_s:g} s and goes on once it answers"
            )
        return out

    def follow(self, rid: int | None) -> Iterator[dict[str, Any]]:
        """The rollout's progress until it ends (from now on), then its summary; a rollout that is not
        driven here answers its summary at once."""
        if rid is None:
            self._is_controller()
            open_ = self.store.unfinished()
            latest = self.store.latest()
            if latest is None:
                raise UsageError(f"no rollout recorded in {self.store.path}")
            rid = open_[-1].id if open_ else latest.id
        with self.lock:
            job = self.runs.get(rid)
            q = job.listen() if job is not None else None
        if job is not None and q is not None:
            try:
                while (item := q.get()) is not _DONE:
                    yield item
            finally:
                job.unlisten(q)
        yield {"result": self.summary(rid)}
