"""The drain, against the fake proxy port: an engine stops only after the proxy says that no
worker of an earlier config can still send it a request, and "could not tell" is not "drained"."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator.deploy.deployer import Deployer
from orchestrator.deploy.operations import Operations
from orchestrator.testing import FakeClock, FakeHost, FakeProxy, FakeStateStore, FakeWeights

from .conftest import World
from .test_proxy_engine import proxy_catalog

CHAT_A = ("127.0.0.9", 8001)


class WatchingProxy(FakeProxy):
    """Answers the drain from a script, then 0; notes which units ran at each poll."""

    def __init__(self, host: FakeHost, script: Sequence[int | None] = ()) -> None:
        super().__init__()
        self.host, self.script = host, list(script)
        self.polls: list[tuple[int | None, list[str]]] = []

    def draining(self, engines: Sequence[tuple[str, int]]) -> int | None:
        super().draining(engines)
        left = self.script.pop(0) if self.script else 0
        self.polls.append((left, self.host.active_units()))
        return left


class DrainWorld(World):
    def __init__(self) -> None:
        super().__init__(proxy_catalog())
        self.proxy = WatchingProxy(self.host)
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.engine = Deployer(
            self.catalog, self.store, lambda name: ports, progress=lambda e, f: self.events.append((e, f))
        )


@pytest.fixture
def dw() -> DrainWorld:
    return DrainWorld()


def test_handover_stops_the_old_engine_only_once_no_old_worker_can_reach_it(dw: DrainWorld) -> None:
    """chat-a -> chat-b: while the proxy counts old workers reaching chat-a, chat-a runs."""
    dw.switch("chat-a")
    dw.proxy.script = [2, 1]
    dw.switch("chat-b")
    assert dw.proxy.drains[-1] == [CHAT_A]
    assert [(left, "vllm-chat-a.service" in units) for left, units in dw.proxy.polls[-3:]] == [
        (2, True),
        (1, True),
        (0, True),
    ]
    assert "vllm-chat-a.service" not in dw.host.active_units()


def test_a_proxy_that_cannot_tell_keeps_the_drain_waiting(dw: DrainWorld) -> None:
    """None (the master re-executing) is asked again, never taken for drained."""
    dw.switch("chat-a")
    dw.proxy.script = [None, None]
    dw.switch("chat-b")
    assert [left for left, _ in dw.proxy.polls[-3:]] == [None, None, 0]
    assert all("vllm-chat-a.service" in units for _, units in dw.proxy.polls[-3:])


def test_stop_start_drains_the_engine_it_stops_before_stopping_it(dw: DrainWorld) -> None:
    """chat-a -> chat-c (same GPUs): the gap config goes out, then chat-a drains, then it stops."""
    dw.switch("chat-a")
    dw.proxy.script = [1]
    dw.switch("chat-c")
    assert [CHAT_A] in dw.proxy.drains
    assert dw.proxy.polls[-2] == (1, ["vllm-chat-a.service"])  # the gap's drain (then the routing step)
    assert dw.host.calls.index("stop vllm-chat-a.service") < dw.host.calls.index("start vllm-chat-c.service")


def test_stop_drains_the_stopped_engine_first(tmp_path: Path) -> None:
    """`stop chat-a`: its route goes, the drain is asked about chat-a, then chat-a stops."""
    catalog = proxy_catalog().model_copy(update={"state_dir": str(tmp_path)})
    host = FakeHost(name="box", clock=FakeClock())
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    proxy = WatchingProxy(host)
    ports.proxy = proxy
    ops = Operations(catalog, lambda name: ports, store=FakeStateStore())
    ops.switch("chat-a")
    proxy.script = [1]
    assert ops.stop("chat-a")["outcome"] == "stopped"
    assert proxy.drains[-1] == [CHAT_A]
    assert proxy.polls[-2:] == [(1, ["vllm-chat-a.service"]), (0, ["vllm-chat-a.service"])]
    assert host.active_units() == []
