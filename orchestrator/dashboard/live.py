"""What the dashboard shows, read from the running agent: its status, history, schedules and events,
each host's GPUs, and the progress events of its running jobs (the ones the CLI streams).

One reader for every open page: a page's SSE stream waits on ``changed`` and gets the newest view;
GPUs and models are re-read only while someone watches, every ``refresh_s``, and at once when a job
of the agent starts, reports progress or ends (the agent's jobs tell the dashboard; nothing polls them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from orchestrator import logs
from orchestrator.core import dashboard as view
from orchestrator.core.dashboard_fleet import own_hosts
from orchestrator.dashboard.fleet import FleetView
from orchestrator.errors import OrchestratorError

log = logs.get_logger()


class Live:
    def __init__(self, agent: Any, refresh_s: float, tune_runs: Callable[[str], list[dict[str, Any]]]) -> None:
        self.agent = agent
        self.refresh_s = refresh_s
        self.tune_runs = tune_runs
        self.changed = threading.Condition()
        self.version = 0
        self.watchers = 0
        self.events: dict[str, list[dict[str, Any]]] = {}  # host -> progress of its running (or last) job
        self._stop = threading.Event()
        self.fleet = FleetView(agent, self.bump, refresh_s)  # a controller's groups and rollouts (the fleet page)

    # -- the agent's jobs --------------------------------------------------------------------------
    def start(self) -> None:
        self.agent.jobs.observers.append(self._observe)
        self.fleet.start()
        threading.Thread(target=self._tick_loop, name="dashboard-tick", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self.fleet.stop()
        if self._observe in self.agent.jobs.observers:
            self.agent.jobs.observers.remove(self._observe)
        self.bump()

    def _observe(self, what: str, job: Any) -> None:
        """Called by the agent's jobs: as a job starts (before its first event), and when it has ended."""
        if what == "started":
            self.events[job.host] = []
            threading.Thread(target=self._listen, args=(job.host, job, job.listen()), daemon=True).start()
        self.bump()

    def _listen(self, host: str, job: Any, q: Any) -> None:
        try:
            while (item := q.get()) is not job.END:
                if isinstance(item, dict) and "event" in item:
                    fields = item.get("fields") or {}
                    if not view.progress_line(str(item["event"]), fields):
                        continue  # nothing the page shows (stage_progress, many a second): no re-read
                    self.events[host].append(
                        {"at": time.time(), "event": item["event"], "fields": fields, "op": job.op}
                    )
                    self.bump()
        finally:
            job.unlisten(q)
            self.bump()

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.fleet.close_idle(time.time())
            if self.watchers:
                self.bump()

    def watch(self, delta: int) -> None:
        """One more (or one fewer) open live page."""
        with self.changed:
            self.watchers += delta

    def bump(self) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def wait(self, seen: int, timeout: float) -> int:
        """The next version after ``seen`` (or ``seen`` again after ``timeout``)."""
        with self.changed:
            self.changed.wait_for(lambda: self.version != seen or self._stop.is_set(), timeout)
            return self.version

    # -- one view of the box ----------------------------------------------------------------------
    def query(self, op: str, args: dict[str, Any]) -> Any:
        """A read-only operation answered as the control socket answers it (the one source of truth)."""
        replies = list(self.agent.dispatch(op, args, "dashboard"))
        last = replies[-1]
        if "error" in last:
            raise OrchestratorError(str(last["error"]["message"]))
        return last["result"]

    def box(self) -> dict[str, Any]:
        catalog = self.agent.catalog
        own = own_hosts(catalog)
        if own == list(catalog.hosts):
            status = self.query("status", {})
        else:  # a controller: the boxes of its groups are their own agents' (the fleet page shows them)
            status = {"agent": self.agent.info(), "schedules": self.query("schedules", {}), "hosts": {}}
            for name in own:
                status["hosts"][name] = self.query("status", {"host": name})["hosts"][name]
        now = time.time()
        hosts = []
        for name, entry in status["hosts"].items():
            models = [m for m in catalog.models.values() if name in [h.name for h in catalog.model_hosts(m.name)]]
            history = self.query("history", {"host": name, "limit": 50})
            running = self._running(name)
            operation = view.timeline(running, self.events.get(name, []) if running else [], now)
            hosts.append(
                {
                    "name": name,
                    "serving": entry.get("serving"),
                    "endpoint": entry.get("endpoint"),
                    "gpus": self._gpus(name, entry),
                    "models": view.model_rows(models, entry),
                    "sleep": view.sleep_summary(entry.get("residency")),
                    "operation": operation,
                    "history": view.history_rows(history[:20], operation),
                    "downtime": view.downtime_series(history),
                    "events": [e for e in self.agent.ops.events(limit=40) if e.get("host") in (None, name)][:15],
                    "tune": [{k: r[k] for k in ("id", "model", "created_at", "winner")} for r in self.tune_runs(name)],
                    "bench": view.bench_rows(
                        [
                            {
                                "model": d.model,
                                "revision": d.revision,
                                "bench": d.bench,
                                "layout": view.layout(catalog.models[d.model]) if d.model in catalog.models else "",
                            }
                            for d in self.agent.ops.benchmarks(name)
                        ]
                    ),
                }
            )
        return {
            "at": now,
            "agent": status.get("agent"),
            "hosts": hosts,
            "schedules": status.get("schedules") or [],
            "groups": sorted(catalog.groups),
        }

    def fleet_view(self) -> dict[str, Any]:
        return self.fleet.read(self.query)

    def _running(self, host: str) -> dict[str, Any] | None:
        job = self.agent.jobs.running.get(host)
        unfinished = self.agent.ops.unfinished(host)
        if job is None and not unfinished:
            return None
        out: dict[str, Any] = {"op": job.op if job else "recover"}
        if unfinished:
            d = unfinished[-1]
            out.update(
                id=d.id,
                model=d.model,
                revision=d.revision,
                trigger=d.trigger,
                timings=[{"phase": t.phase, "entered_at": t.entered_at, "left_at": t.left_at} for t in d.timings],
            )
        elif job is not None:
            out.update(model=job.args.get("model"), timings=[])
        return out

    def _gpus(self, host: str, entry: dict[str, Any]) -> dict[str, Any]:
        ports = self.agent.ops.ports_for(host)
        try:
            snapshot = ports.gpus.snapshot()
        except OrchestratorError as exc:
            return {"error": str(exc), "rows": []}
        owners: dict[int, str] = {}
        units = view.unit_owners(entry, {m.name: m.unit_name for m in self.agent.catalog.models.values()})
        resident = (entry.get("residency") or {}).get("models") or []
        states = {str(m["model"]): str(m["state"]) for m in resident}
        for unit, model in units.items():
            try:  # the main PID and every process of its cgroup (EngineCore, TP workers)
                for pid in [ports.systemd.unit_state(unit).main_pid, *ports.systemd.cgroup_pids(unit)]:
                    owners[pid] = model
            except OrchestratorError as exc:
                log.info("dashboard_pids_unknown", host=host, unit=unit, error=str(exc))
        return {"error": None, "rows": view.gpu_rows(snapshot, owners, states)}
