"""In-memory fakes of every port, shipped with the package for tests of the core and the engine: one
module per role (clock, host, services, records, stores), every name importable from here.

``FakeHost`` is one simulated machine: units with a scripted behaviour when started, GPU memory
held by their processes, an HTTP server per running unit. The fakes implement the ports in
``orchestrator.ports`` and nothing more; real-part tests use the adapters on booted test hosts.
"""

from __future__ import annotations

from orchestrator.testing.clock import FakeClock
from orchestrator.testing.host import (
    Behaviour,
    FakeEngineControl,
    FakeGpus,
    FakeHealth,
    FakeHost,
    FakeShell,
    FakeSystemd,
)
from orchestrator.testing.records import FakeResidencyStore, FakeStateStore
from orchestrator.testing.services import FakeProxy, FakeSmoke, FakeWeights, live_config
from orchestrator.testing.stores import FakeConfigStore, FakeRolloutStore, FakeTuneStore

__all__ = [
    "Behaviour",
    "FakeClock",
    "FakeConfigStore",
    "FakeEngineControl",
    "FakeGpus",
    "FakeHealth",
    "FakeHost",
    "FakeProxy",
    "FakeResidencyStore",
    "FakeRolloutStore",
    "FakeShell",
    "FakeSmoke",
    "FakeStateStore",
    "FakeSystemd",
    "FakeTuneStore",
    "FakeWeights",
    "live_config",
]
