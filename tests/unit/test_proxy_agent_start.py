"""The agent's start brings a host's front proxy up before any switch, so a client finds the port
answering (503 "not loaded" for the catalog's names, 404 for others) instead of nothing listening."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.deploy.locks import host_lock

from .test_demand_push import Pushed


@pytest.fixture
def world(tmp_path: Path) -> Iterator[Pushed]:
    w = Pushed(tmp_path, on_demand=False)
    yield w
    w.agent.stop()


def test_the_agents_start_brings_the_proxy_up_with_nothing_served(world: Pushed) -> None:
    """No switch yet: one config applied, in which both catalog names answer 503 model_not_loaded."""
    assert world.agent.demand.start_proxies() == {"box": "started or reloaded"}
    [config] = world.proxy.applied
    assert 'code":"model_not_loaded"}}\' if { method POST } { var(txn.model) -m str "a" "b" }' in config
    assert world.agent.demand.start_proxies() == {}  # up already: nothing applied again


def test_a_busy_host_is_left_and_the_agent_starts(world: Pushed) -> None:
    """The host's lock held (an operation runs): logged and left, nothing applied, no error."""
    with host_lock(world.agent.catalog.state_dir, "box"):
        assert world.agent.demand.start_proxies() == {}
    assert world.proxy.applied == []
