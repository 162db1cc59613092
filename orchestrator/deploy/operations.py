"""Operations: what the CLI (in-process) and the agent (over its socket) both run.

Each operation takes the host's lock, so a second switch on a busy host is refused with the
running deployment named, whether it was started by another CLI or by the agent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment
from orchestrator.deploy.engine import Engine, default_trigger
from orchestrator.deploy.locks import host_lock
from orchestrator.errors import UsageError
from orchestrator.ports import HostPorts, ProgressCallback


class Operations:
    def __init__(self, catalog: Catalog, ports_for: Callable[[str], HostPorts], *,
                 store: SqliteStore | None = None, template: str | None = None,
                 before_step: Callable[[Deployment], None] | None = None) -> None:
        self.catalog = catalog
        self.state_dir = catalog.state_dir
        self.store = store or SqliteStore(Path(catalog.state_dir) / "state.db")
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

    def _holder(self, host: str) -> str:
        running = self.store.unfinished(host)
        if not running:
            return "another operation is running"
        d = running[-1]
        return f"deployment #{d.id} (revision {d.revision}, {d.model}, {d.trigger}) is in phase {d.phase.value}"

    def _host_of(self, model: str) -> str:
        if model not in self.catalog.models:
            raise UsageError(f"unknown model {model!r} (known: {', '.join(sorted(self.catalog.models))})")
        return self.catalog.model_host(model).name

    # -- operations ---------------------------------------------------------------------------
    def switch(self, model: str, *, trigger: str | None = None, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]:
        host = self._host_of(model)
        with host_lock(self.state_dir, host, self._holder(host)):
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
        host = host or self._only_host()
        with host_lock(self.state_dir, host, self._holder(host)):
            eng = self.engine(progress)
            recovered = self._recover_host(eng, host)
            dep = eng.plan_rollback(host, to_revision, trigger=trigger)
            return {"noop": False, "recovered": recovered, **eng.run(dep.id).to_dict()}

    def stage(self, model: str, *, peer: dict[str, Any] | None = None,
              progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Download and verify a model's weights while whatever serves keeps serving; ``peer``: copy
        them from that box instead (a fleet rollout's one download per fleet, rollout/peer.py)."""
        host = self._host_of(model)
        ports = self.ports_for(host)
        if ports.weights is None:
            raise UsageError(f"host {host} has no weight store configured")
        weights = ports.weights
        with host_lock(self.state_dir, f"{host}.stage", f"model weights are already being staged on {host}"):
            spec = self.engine(progress).spec_for(self.catalog.models[model])
            if peer is not None:
                from orchestrator.rollout.peer import with_peer

                weights, source = with_peer(ports.weights, peer)
                spec = replace(spec, source=source)
            staged = weights.stage(spec, progress or (lambda e, f: None))
        return {"model": model, "host": host, "path": staged.path, "revision": staged.revision,
                "bytes": staged.total_bytes}

    def recover(self, host: str | None = None, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        """Drive every unfinished deployment (a crash, a parked SIGTERM) to an outcome."""
        out: list[dict[str, Any]] = []
        for name in [host] if host else list(self.catalog.hosts):
            with host_lock(self.state_dir, name, self._holder(name)):
                out += self._recover_host(self.engine(progress), name)
        return out

    def _recover_host(self, eng: Engine, host: str) -> list[dict[str, Any]]:
        return [eng.run(d.id).to_dict() for d in self.store.unfinished(host)]

    def _only_host(self) -> str:
        if len(self.catalog.hosts) != 1:
            raise UsageError(f"there are {len(self.catalog.hosts)} hosts: say which one with --host "
                             f"({', '.join(sorted(self.catalog.hosts))})")
        return next(iter(self.catalog.hosts))

    def history(self, host: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if host is not None and host not in self.catalog.hosts:
            raise UsageError(f"unknown host {host!r} (known: {', '.join(sorted(self.catalog.hosts))})")
        return [d.to_dict() for d in self.store.history(host, limit)]

    def status(self, host: str | None = None, probe: bool = True) -> dict[str, Any]:
        hosts = [host] if host else list(self.catalog.hosts)
        out: dict[str, Any] = {"at": time.time(), "hosts": {}}
        for name in hosts:
            if name not in self.catalog.hosts:
                raise UsageError(f"unknown host {name!r} (known: {', '.join(sorted(self.catalog.hosts))})")
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
            out["hosts"][name] = entry
        return out
