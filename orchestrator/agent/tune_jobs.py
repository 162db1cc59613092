"""Tune runs as jobs of the agent that owns the model's host, not of the CLI that asked for them.

A run (rollout/tune.py, the same code as an in-CLI run) holds its host's job slot from the plan to
the report, so nothing else switches that box meanwhile; every client only starts, follows, resumes
or aborts it, and one that goes away (Ctrl-C, a dropped SSH session, SIGKILL) detaches and nothing
else. Each measurement is recorded before the next candidate starts (state.db's tune tables), so an
agent that restarts resumes the host's unfinished run and never measures a layout twice.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator import logs
from orchestrator.agent.controller import own_hosts
from orchestrator.agent.server import _DONE, Job, Jobs
from orchestrator.contract.args import TuneArgs, TuneHostArgs
from orchestrator.deploy.operations import Operations
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.rollout.tune import Tuner, request_of, tune_store

log = logs.get_logger()

_OPS = ("tune_start", "tune_plan", "tune_resume", "tune_abort")  # its jobs: the table's names (contract/ops.py)


class TuneJobs:
    """``ops``, ``config_path``: the agent's current ones (a pushed deploy.toml replaces both)."""

    def __init__(
        self,
        jobs: Jobs,
        ops: Callable[[], Operations],
        config_path: Callable[[], Path | None],
        stopping: threading.Event | None = None,
    ) -> None:
        """``stopping``: the agent's; a running tune parks before its next candidate once it is set."""
        self.jobs, self.ops, self.config_path = jobs, ops, config_path
        self.stopping = stopping or threading.Event()
        self.stop_requested: set[str] = set()  # hosts whose running tune ends before its next candidate
        self.lock = threading.Lock()

    def _tuner(self, job: Job, host: str) -> Tuner:
        def publish(event: str, fields: dict[str, Any]) -> None:
            job.publish({"event": event, "fields": fields})

        def should_stop() -> bool:
            with self.lock:
                return host in self.stop_requested

        return Tuner(self.ops(), self.config_path(), publish, should_stop=should_stop, should_park=self.stopping.is_set)

    def _submit(self, host: str, op: str, args: dict[str, Any], body: Callable[[Tuner], dict[str, Any]]) -> Job:
        def run(job: Job) -> dict[str, Any]:
            try:
                return body(self._tuner(job, host))
            finally:
                with self.lock:
                    self.stop_requested.discard(host)

        return self.jobs.submit(host, op, args, run)

    def _host(self, args: TuneHostArgs) -> str:
        return self._owned(self.ops().catalog.target(args.model, args.host).name)

    def _owned(self, host: str) -> str:
        """A fleet host this agent only reaches as the controller is its box agent's to tune, not ours."""
        if host not in own_hosts(self.ops().catalog):
            raise UsageError(
                f"host {host} is a group host this agent reaches as its fleet's controller: its own "
                f"agent owns it and runs its tune (`orchestrator --host {host} tune ...`)"
            )
        return host

    def _running(self, host: str, *, plan: bool = True) -> Job | None:
        """The host's tune job (``plan`` False: a run, not the plan before one)."""
        job = self.jobs.busy(host)
        ops = _OPS if plan else _OPS[:1] + _OPS[2:]
        return job if job is not None and job.op in ops else None

    # -- the operations (contract.sides.TuneController) ---------------------------------------------
    def plan(self, args: TuneArgs) -> Iterator[dict[str, Any]]:
        """Stage the weights and pick the candidates, holding the host; nothing stops."""
        req = request_of(args)
        host = self._owned(self.ops().catalog.target(model=args.model).name)
        return _stream(self._submit(host, "tune_plan", _shown(args), lambda t: t.prepare(req).summary()))

    def start(self, args: TuneArgs) -> Iterator[dict[str, Any]]:
        req = request_of(args)
        host = self._owned(self.ops().catalog.target(model=args.model).name)
        return _stream(self._submit(host, "tune_start", _shown(args), lambda t: t.start(t.prepare(req))))

    def resume(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]:
        """The host's unfinished run, driven on; one already running here is followed instead."""
        host = self._host(args)
        running = self._running(host)
        if running is not None:
            return _stream(running, {"event": "tune_following", "fields": {"host": host, "op": running.op}})
        return _stream(self._submit(host, "tune_resume", args.model_dump(), lambda t: t.resume(host, args.model)))

    def abort(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]:
        """A running run stops before its next candidate and what served before returns; an unfinished
        one that nothing drives is ended the same way now."""
        host = self._host(args)
        with self.lock:
            running = self._running(host, plan=False)
            if running is not None:
                self.stop_requested.add(host)
        if running is not None:
            return _stream(
                running,
                {
                    "event": "tune_abort_requested",
                    "fields": {"host": host, "op": running.op, "when": "before its next candidate"},
                },
            )
        return _stream(self._submit(host, "tune_abort", args.model_dump(), lambda t: t.abort(host, args.model)))

    def follow(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]:
        """The host's running tune to its end (its report), else the last run's report (or status) at once."""
        host = self._host(args)
        running = self._running(host)
        if running is None:
            shown = self.status(args)
            run = shown["run"]
            yield {"result": run["report"] if run is not None and run["report"] is not None else shown}
            return
        yield from _stream(running, {"event": "tune_following", "fields": {"host": host, "op": running.op}})

    def status(self, args: TuneHostArgs) -> dict[str, Any]:
        host = self._host(args)
        running = self._running(host)
        out: dict[str, Any] = {"host": host, "running": running.op if running is not None else None, "run": None}
        if not (Path(self.ops().catalog.state_dir) / "state.db").exists():
            return out
        store = tune_store(self.ops().catalog)
        run = store.unfinished(host) or next(iter(store.finished(host, 1)), None)
        if run is None:
            return out
        measured = [r.candidate for r in store.results(run.id)]
        out["run"] = {
            "id": run.id,
            "model": run.model,
            "state": run.state,
            "measured": measured,
            "candidates": [c["name"] for c in run.settings["candidates"]],
            "report": run.result,
        }
        return out

    # -- at agent start ---------------------------------------------------------------------------
    def resume_unfinished(self, hosts: list[str]) -> set[str]:
        """Each host's unfinished run, driven again (its interrupted switch recovered first); the hosts
        it started a job on (the agent's own recovery then leaves them to it)."""
        ops = self.ops()
        if not (Path(ops.catalog.state_dir) / "state.db").exists():
            return set()  # never tuned here: no state.db to create
        store = tune_store(ops.catalog)
        started = set()
        for host in hosts:
            run = store.unfinished(host)
            if run is None:
                continue
            log.info("tune_resumed", run=run.id, model=run.model, host=host)
            try:
                self._submit(host, "tune_resume", {"host": host, "model": None}, _resume(host))
            except OrchestratorError as exc:
                log.warning("tune_resume_failed", run=run.id, host=host, error=str(exc))
                continue
            started.add(host)
        return started


def _shown(args: TuneArgs) -> dict[str, Any]:
    """What a busy host's refusal and `status --follow` name of a run: its model and layouts."""
    return {"model": args.model, "layouts": args.layouts}


def _resume(host: str) -> Callable[[Tuner], dict[str, Any]]:
    return lambda t: t.resume(host)


def _stream(job: Job, first: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The job's events from now on, then its result (the client raises an error reply as its own)."""
    q: queue.Queue[Any] = job.listen()  # now, not on the first read: nothing published after this is lost

    def items() -> Iterator[dict[str, Any]]:
        try:
            if first is not None:
                yield first
            while (item := q.get()) is not _DONE:
                yield item
        finally:
            job.unlisten(q)
        if job.result is None:
            raise UsageError(f"tune job {job.op} on host {job.host} ended without a result")
        yield job.result

    return items()
