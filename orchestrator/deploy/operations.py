"""Operations: what the CLI (in-process) and the agent (over its socket) both run.

Each operation takes the host's lock, so a second switch on a busy host is refused with the
running deployment named, whether it was started by another CLI or by the agent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment
from orchestrator.deploy.engine import Engine, default_trigger
from orchestrator.deploy.locks import host_lock
from orchestrator.errors import OrchestratorError, UsageError
from orchestrator.ports import HostPorts, ProgressCallback, StateStore


class Operations:
    def __init__(self, catalog: Catalog, ports_for: Callable[[str], HostPorts], *,
                 store: StateStore | None = None, template: str | None = None,
                 before_step: Callable[[Deployment], None] | None = None) -> None:
        self.catalog = catalog
        self.state_dir = catalog.state_dir
        self.store = store or SqliteStore(Path(catalog.state_dir) / "state.db", group=catalog.socket_group)
        self.ports_for = ports_for
        self.template = template
        self.before_step = before_step
        self.engines: list[Engine] = []

    def engine(self, progress: ProgressCallback | None = None) -> Engine:
        eng = Engine(self.catalog, self.store, self.ports_for, template=self.template, progress=progress,
                     before_step=self.before_step)
        self.engines.append(eng)
        return eng

    def park_all(self) -> None:
        """SIGTERM: every running engine finishes its step, persists, and stops."""
        for eng in self.engines:
            eng.park.set()

    # -- lookups callers use instead of the catalog or the store ------------------------------------
    def holder(self, host: str) -> str:
        """What holds the host now, for a Busy message."""
        running = self.store.unfinished(host)
        if not running:
            return "another operation is running"
        d = running[-1]
        return f"deployment #{d.id} (revision {d.revision}, {d.model}, {d.trigger}) is in phase {d.phase.value}"

    def host_of(self, model: str) -> str:
        """The host that serves ``model`` (UsageError naming the known models when unknown)."""
        self.catalog.model(model)
        return self.catalog.model_host(model).name

    def resolve_host(self, host: str | None) -> str:
        """``host`` checked against the catalog, or the only host when it is left out."""
        return self.catalog.host(host).name if host is not None else self.catalog.only_host().name

    def serving(self, host: str | None) -> Deployment | None:
        """The deployment recorded as serving on the host (the only host when left out)."""
        return self.store.serving(self.resolve_host(host))

    def unfinished(self, host: str) -> list[Deployment]:
        return self.store.unfinished(host)

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        self.store.record_event(at, host, kind, detail)

    def events(self, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.store.events(kind=kind, limit=limit)

    def record_bench(self, dep_id: int, record: dict[str, Any]) -> None:
        self.store.record_bench(dep_id, record)

    def benchmarks(self, host: str | None) -> list[Deployment]:
        """The latest benchmarked deployment of each model on the host, newest first."""
        latest: dict[str, Deployment] = {}
        for dep in self.store.history(self.resolve_host(host), limit=1000):
            if dep.bench and dep.model not in latest:
                latest[dep.model] = dep
        return list(latest.values())

    def probe(self, host: str) -> tuple[Deployment | None, bool]:
        """(what serves, is it healthy); raises TransportError when the host cannot be reached, so
        the watch can tell "down" from "cannot look" (is_healthy folds both into False)."""
        serving = self.store.serving(host)
        if serving is None:
            return None, True
        self.ports_for(host).systemd.unit_state(serving.spec.unit_name)
        eng = Engine(self.catalog, self.store, self.ports_for, template=self.template)
        return serving, eng.is_healthy(serving)

    def schedules(self, now: float, next_runs: dict[str, float] | None = None) -> list[dict[str, Any]]:
        """Each schedule with its next firing time and the last thing it did."""
        events = [e for e in self.store.events(limit=500) if e.get("schedule")]
        rows = []
        for name, s in self.catalog.schedules.items():
            nxt = (next_runs or {}).get(name) or sched.next_run(s, now)
            last = next((e for e in events if e["schedule"] == name), None)
            rows.append({"name": name, "cron": s.cron, "action": s.action, "model": s.model, "window": s.window,
                         "next_run": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nxt)),
                         "next_run_ts": nxt, "last": last})
        return rows

    # -- operations ---------------------------------------------------------------------------
    @contextmanager
    def _model_locks(self, model: str) -> Iterator[None]:
        """The lock of every host a model runs on (a multi-node model switches all its nodes)."""
        with ExitStack() as stack:
            for node in self.catalog.nodes_of(model):
                stack.enter_context(host_lock(self.state_dir, node.name, self.holder(node.name)))
            yield

    def switch(self, model: str, *, trigger: str | None = None, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]:
        host = self.host_of(model)
        with self._model_locks(model):
            eng = self.engine(progress)
            recovered = self._recover_host(eng, host)
            dep = eng.plan_switch(model, trigger=trigger or default_trigger(), no_rollback=no_rollback, force=force)
            if dep is None:
                serving = self.store.serving(host)
                assert serving is not None
                return {"noop": True, "host": host, "model": model, "revision": serving.revision,
                        "message": f"{model} is already active and healthy on {host} (revision "
                                   f"{serving.revision}); nothing to do (use --force to redeploy)"}
            final = eng.run(dep.id)
            return {"noop": False, "recovered": recovered, **final.to_dict()}

    def rollback(self, host: str | None = None, to_revision: int | None = None, *, trigger: str = "rollback",
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        host = self.resolve_host(host)
        with host_lock(self.state_dir, host, self.holder(host)):
            eng = self.engine(progress)
            recovered = self._recover_host(eng, host)
            dep = eng.plan_rollback(host, to_revision, trigger=trigger)
            return {"noop": False, "recovered": recovered, **eng.run(dep.id).to_dict()}

    def stage(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Download and verify a model's weights while whatever serves keeps serving."""
        host = self.host_of(model)
        ports = self.ports_for(host)
        if ports.weights is None:
            raise UsageError(f"host {host} has no weight store configured")
        with host_lock(self.state_dir, f"{host}.stage", f"model weights are already being staged on {host}"):
            spec = self.engine(progress).spec_for(self.catalog.models[model])
            staged = ports.weights.stage(spec, progress or (lambda e, f: None))
        return {"model": model, "host": host, "path": staged.path, "revision": staged.revision,
                "bytes": staged.total_bytes}

    def recover(self, host: str | None = None, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        """Drive every unfinished deployment (a crash, a parked SIGTERM) to an outcome."""
        out: list[dict[str, Any]] = []
        for name in [self.catalog.host(host).name] if host else list(self.catalog.hosts):
            with host_lock(self.state_dir, name, self.holder(name)):
                out += self._recover_host(self.engine(progress), name)
        return out

    def _recover_host(self, eng: Engine, host: str) -> list[dict[str, Any]]:
        return [eng.run(d.id).to_dict() for d in self.store.unfinished(host)]

    def _node_states(self, dep: Deployment, probe: bool) -> list[dict[str, Any]]:
        """Each unit of a multi-node model: its host, role and (probed) systemd state."""
        rows = [(n.host, n.role + (f" rank {n.rank}" if n.role == "headless" else ""), n.unit_name)
                for n in dep.spec.nodes]
        rows.append((dep.host, "engine (API)" if dep.spec.backend == "ray" else "rank 0 (API)", dep.spec.unit_name))
        out = []
        for host, role, unit in rows:
            state = "not probed"
            if probe:
                try:
                    state = self.ports_for(host).systemd.unit_state(unit).active_state
                except OrchestratorError as exc:
                    state = f"unreachable: {exc}"
            out.append({"host": host, "role": role, "unit": unit, "state": state})
        return out

    def history(self, host: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if host is not None:
            self.catalog.host(host)
        return [d.to_dict() for d in self.store.history(host, limit)]

    def status(self, host: str | None = None, probe: bool = True) -> dict[str, Any]:
        hosts = [self.catalog.host(host).name] if host else list(self.catalog.hosts)
        out: dict[str, Any] = {"at": time.time(), "hosts": {}}
        for name in hosts:
            serving = self.store.serving(name)
            running = self.store.unfinished(name)
            entry: dict[str, Any] = {
                "serving": None if serving is None else {"revision": serving.revision, "model": serving.model,
                                                         "unit": serving.spec.unit_name,
                                                         "url": serving.spec.base_url},
                "running": [{"id": d.id, "revision": d.revision, "model": d.model, "phase": d.phase.value,
                             "trigger": d.trigger} for d in running],
            }
            if probe and serving is not None:
                eng = Engine(self.catalog, self.store, self.ports_for, template=self.template)
                entry["serving"]["healthy"] = eng.is_healthy(serving)
            if serving is not None and serving.spec.nodes:
                entry["serving"]["nodes"] = self._node_states(serving, probe)
            out["hosts"][name] = entry
        return out
