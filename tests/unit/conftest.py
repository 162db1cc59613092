"""Fixtures for unit tests of the core and the engine: fakes of every port, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.catalog import Catalog
from orchestrator.deploy.engine import Engine
from orchestrator.testing import FakeHost, FakeStateStore, FakeWeights


def make_catalog(**overrides: Any) -> Catalog:
    data: dict[str, Any] = {
        "defaults": {"engine": ["/opt/vllm/bin/vllm", "serve"], "free_timeout_s": 5, "load_deadline_s": 30,
                     "health_interval_s": 0.1},
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
        self.engine = Engine(self.catalog, self.store, lambda name: ports,
                             progress=lambda e, f: self.events.append((e, f)))

    def switch(self, model: str, **kw: Any) -> Any:
        dep = self.engine.plan_switch(model, **kw)
        return None if dep is None else self.engine.run(dep.id)


@pytest.fixture
def world() -> World:
    return World()
