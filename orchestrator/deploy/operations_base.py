"""The state every operation shares: the stores (opened on first use), the deployers in flight, and the
lookups the fronts use instead of the catalog or the store. operations_views.py reads on it;
operations.py (the operations that hold a host's lock and change a box) runs on both."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.adapters.residency_store import SqliteResidencyStore
from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.deployer import Deployer
from orchestrator.ports import HostPorts, ProgressCallback, ResidencyStore, StateStore
from orchestrator.secrets import redact_tree


class OperationsBase:
    """The stores, the deployers in flight and the record lookups (Operations adds what acts)."""

    def __init__(
        self,
        catalog: Catalog,
        ports_for: Callable[[str], HostPorts],
        *,
        store: StateStore | None = None,
        template: str | None = None,
        residency: ResidencyStore | None = None,
        before_step: Callable[[Deployment], None] | None = None,
        reading: bool = False,
    ) -> None:
        """``reading``: a read-only command's (status, history...): the stores open read-only (SqliteFile)."""
        self.catalog = catalog
        self.reading = reading
        self.state_dir = catalog.state_dir
        # The stores open on first use: building the operations writes nothing, so a request refused
        # before it needs a record (two models that cannot serve together) leaves no state dir behind.
        self._store = store
        self._residency_store = residency
        self._open_lock = threading.Lock()  # the agent's threads share one store of each
        self.ports_for = ports_for
        self.template = template
        self.before_step = before_step
        # The deployers of operations in flight, for SIGTERM; each leaves when its operation ends
        # (a list of every deployer ever built grew with each operation for the agent's lifetime).
        self.deployers: set[Deployer] = set()
        self._deployers_lock = threading.Lock()

    @property
    def store(self) -> StateStore:
        with self._open_lock:
            if self._store is None:
                self._store = SqliteStore(
                    Path(self.catalog.state_dir) / "state.db", group=self.catalog.socket_group, reading=self.reading
                )
            return self._store

    @property
    def residency(self) -> ResidencyStore:
        """Warm switches: which models sleep (a file of its own beside state.db)."""
        with self._open_lock:
            if self._residency_store is None:
                self._residency_store = SqliteResidencyStore(
                    Path(self.catalog.state_dir) / "residency.db", group=self.catalog.socket_group, reading=self.reading
                )
            return self._residency_store

    def deployer(self, progress: ProgressCallback | None = None) -> Deployer:
        """A deployer for lookups and planning; ``running`` is the one for an operation that runs steps."""
        return Deployer(
            self.catalog,
            self.store,
            self.ports_for,
            residency=self.residency,
            template=self.template,
            progress=progress,
            before_step=self.before_step,
        )

    @contextmanager
    def running(self, progress: ProgressCallback | None = None) -> Iterator[Deployer]:
        """A deployer that ``park_all`` reaches while the block runs, and forgets after it."""
        eng = self.deployer(progress)
        with self._deployers_lock:
            self.deployers.add(eng)
        try:
            yield eng
        finally:
            with self._deployers_lock:
                self.deployers.discard(eng)

    def park_all(self) -> None:
        """SIGTERM: every running deployer finishes its step, persists, and stops."""
        with self._deployers_lock:
            for eng in self.deployers:
                eng.park.set()

    def context(self, host: str, progress: ProgressCallback | None = None, **bound: Any) -> StepContext:
        """What an operation's actions on ``host`` see outside a deployment (no step: nothing persisted
        with one): the host's ports, the catalog, the residency; ``bound`` goes with every progress event."""
        return StepContext(
            ports=self.ports_for(host),
            catalog=self.catalog,
            progress=progress or (lambda e, f: None),
            bound={"host": host, **bound},
            residency=self.residency,
        )

    # -- lookups callers use instead of the catalog or the store ------------------------------------
    def holder(self, host: str) -> str:
        """What holds the host now, for a Busy message."""
        running = self.store.unfinished(host)
        if not running:
            return "another operation is running"
        d = running[-1]
        return f"deployment #{d.id} (revision {d.revision}, {d.model}, {d.trigger}) is in phase {d.phase.value}"

    def serving(self, host: str | None) -> Deployment | None:
        """The deployment recorded as serving on the host (the only host when left out)."""
        return self.store.serving(self.catalog.target(host=host).name)

    def unfinished(self, host: str) -> list[Deployment]:
        return self.store.unfinished(host)

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        self.store.record_event(at, host, kind, redact_tree(detail))  # loop failures quote outside text

    def events(self, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        return self.store.events(kind=kind, limit=limit)

    def record_bench(self, dep_id: int, record: dict[str, Any]) -> None:
        self.store.record_bench(dep_id, record)

    def deployments(self, host: str, limit: int = 50) -> list[Deployment]:
        """The host's deployment records, newest first (history as records, for applications)."""
        return self.store.history(self.catalog.target(host=host).name, limit)

    def benchmarks(self, host: str | None) -> list[Deployment]:
        """The latest benchmarked deployment of each model on the host, newest first."""
        latest: dict[str, Deployment] = {}
        for dep in self.store.history(self.catalog.target(host=host).name, limit=1000):
            if dep.bench and dep.model not in latest:
                latest[dep.model] = dep
        return list(latest.values())
