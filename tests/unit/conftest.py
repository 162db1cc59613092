"""Fixtures for unit tests of the core and the engine: fakes of every port, no I/O."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import NO_CHANGE, ServingChange
from orchestrator.core.states import TRANSITIONS, Event, Fallback, Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.deploy.operations import Operations
from orchestrator.errors import TransportError
from orchestrator.ports import HostPorts
from orchestrator.testing import FakeClock, FakeHost, FakeStateStore, FakeWeights


def legal_move(here: Phase, there: Phase, fallback: Fallback) -> bool:
    """Whether some event leads from ``here`` to ``there`` in core/states.py's table."""
    return any(TRANSITIONS.get((here, event, fallback)) is there for event in Event)


@pytest.fixture(autouse=True)
def _moves_follow_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 1, held in every unit test: each move the deployer records (deploy/deployer.py is the one caller of
    a store's transition) is one the table allows for the deployment's fallback."""
    for cls in (FakeStateStore, SqliteStore):

        def guarded(
            self: Any,
            dep_id: int,
            phase: Phase,
            at: float,
            serving: ServingChange = NO_CHANGE,
            _original: Any = cls.transition,
        ) -> None:
            if sys._getframe(1).f_globals.get("__name__") == "orchestrator.deploy.deployer":
                dep = self.get(dep_id)
                assert legal_move(dep.phase, phase, dep.fallback), (
                    f"{dep.phase.value} -> {phase.value} is not in core/states.py's table "
                    f"(fallback {dep.fallback.value})"
                )
            _original(self, dep_id, phase, at, serving)

        monkeypatch.setattr(cls, "transition", guarded)


def make_catalog(**overrides: Any) -> Catalog:
    data: dict[str, Any] = {
        "defaults": {
            "engine": ["/opt/vllm/bin/vllm", "serve"],
            "free_timeout_s": 5,
            "load_deadline_s": 30,
            "health_interval_s": 0.1,
        },
        "hosts": {"box": {"transport": "ssh", "address": "127.0.0.9", "gpus": 8, "gpu_memory_gib": 96}},
        "models": {
            "alpha": {"repo": "org/alpha", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8000},
            "beta": {"repo": "org/beta", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8001},
            "gamma": {"repo": "org/gamma", "gpus": [4, 5, 6, 7], "tensor_parallel": 4, "port": 8002},
        },
    }
    data.update(overrides)
    return Catalog.model_validate(data)


class World:
    """A fake host, a store in memory and an engine wired to them."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self.catalog = catalog or make_catalog()
        self.host = FakeHost(name="box")
        self.weights = FakeWeights()
        self.store = FakeStateStore()
        self.events: list[tuple[str, dict[str, Any]]] = []
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        self.engine = Deployer(
            self.catalog, self.store, lambda name: ports, progress=lambda e, f: self.events.append((e, f))
        )

    def switch(self, model: str, **kw: Any) -> Any:
        dep = self.engine.plan_switch(model, **kw)
        return None if dep is None else self.engine.run(dep.id)


@pytest.fixture
def world() -> World:
    return World()


class OpsWorld:
    """Operations (the facade the agent uses) over one fake host, a fake clock and a state dir of its own."""

    def __init__(self, state_dir: Path, **catalog: Any) -> None:
        self.catalog = make_catalog(state_dir=str(state_dir), **catalog)
        self.clock = FakeClock()
        self.host = FakeHost(name="box", clock=self.clock)
        self.down: str | None = None  # set: reaching the host fails with this message
        self.store = FakeStateStore()
        ports = self.host.ports(self.catalog.hosts["box"], FakeWeights())

        def ports_for(name: str) -> HostPorts:
            if self.down is not None:
                raise TransportError(self.down, host=name)
            return ports

        self.ops = Operations(self.catalog, ports_for, store=self.store)

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.store.events(limit=500) if e["kind"] == kind]
