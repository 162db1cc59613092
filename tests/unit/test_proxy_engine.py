"""The engine with a front proxy, against fake ports: a set of models per host, handover or
stop-start by GPUs, routes moved as a phase, rollback to the set before."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.records import Mode
from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.errors import WeightsError
from orchestrator.testing import FakeProxy

from .conftest import World, make_catalog


def proxy_catalog() -> Any:
    tp4 = {"tensor_parallel": 4}
    return make_catalog(
        proxy={"enabled": True, "port": 8000},
        models={
            "chat-a": {"repo": "org/a", "gpus": [0, 1, 2, 3], "served_name": "chat", "port": 8001, **tp4},
            "chat-b": {"repo": "org/b", "gpus": [4, 5, 6, 7], "served_name": "chat", "port": 8002, **tp4},
            "chat-c": {"repo": "org/c", "gpus": [0, 1, 2, 3], "served_name": "chat", "port": 8003, **tp4},
            "code": {"repo": "org/code", "gpus": [4, 5], "tensor_parallel": 2, "port": 8004},
        },
    )


class ProxyWorld(World):
    def __init__(self) -> None:
        super().__init__(proxy_catalog())
        self.proxy = FakeProxy()
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.engine = Deployer(
            self.catalog, self.store, lambda name: ports, progress=lambda e, f: self.events.append((e, f))
        )

    def serving(self) -> list[str]:
        return [d.model for d in self.store.serving_set("box")]


@pytest.fixture
def pw() -> ProxyWorld:
    return ProxyWorld()


def test_two_models_on_disjoint_gpus_serve_together(pw: ProxyWorld) -> None:
    """chat-a then code: both run, both are in the set and both names route."""
    assert pw.switch("chat-a").phase is Phase.ACTIVE
    assert pw.switch("code").phase is Phase.ACTIVE
    assert pw.serving() == ["chat-a", "code"]
    assert pw.host.active_units() == ["vllm-chat-a.service", "vllm-code.service"]
    assert pw.proxy.config is not None
    assert '-m str "chat" }' in pw.proxy.config and '-m str "code" }' in pw.proxy.config


def test_disjoint_switch_is_a_handover(pw: ProxyWorld) -> None:
    """chat-a -> chat-b (disjoint GPUs): chat-b starts before chat-a stops; the route moves in between."""
    pw.switch("chat-a")
    dep = pw.switch("chat-b")
    assert dep.phase is Phase.ACTIVE
    assert pw.engine.plan_of(dep).mode is Mode.HANDOVER  # type: ignore[union-attr]
    calls = pw.host.calls
    assert calls.index("start vllm-chat-b.service") < calls.index("stop vllm-chat-a.service")
    assert pw.serving() == ["chat-b"]
    assert pw.proxy.routed is not None and "127.0.0.9:8002" in pw.proxy.routed
    assert "8001" not in pw.proxy.routed
    assert not any("model_switching" in c for c in pw.proxy.applied)  # never a gap on the route


def test_a_name_nothing_served_answers_loading_while_it_comes_up(pw: ProxyWorld) -> None:
    """The first switch to "code": its name answers 503 model_loading until it routes, never 404."""
    pw.switch("chat-a")
    assert pw.switch("code").phase is Phase.ACTIVE
    loading, routed = pw.proxy.applied[-2:]
    assert 'code":"model_loading"}}\' if { method POST } { var(txn.model) -m str "code" }' in loading
    assert 'use_backend m2 if { var(txn.model) -m str "code" }' in routed and "model_loading" not in routed


def test_overlapping_switch_is_stop_start_with_a_503_gap(pw: ProxyWorld) -> None:
    """chat-a -> chat-c (same GPUs): chat-a stops first and the route answers 503 meanwhile."""
    pw.switch("chat-a")
    dep = pw.switch("chat-c")
    assert dep.phase is Phase.ACTIVE
    assert pw.engine.plan_of(dep).mode is Mode.STOP_START  # type: ignore[union-attr]
    calls = pw.host.calls
    assert calls.index("stop vllm-chat-a.service") < calls.index("start vllm-chat-c.service")
    assert any("model_switching" in c and '-m str "chat" }' in c for c in pw.proxy.applied)
    assert pw.serving() == ["chat-c"]


def test_switch_stops_only_models_on_its_gpus(pw: ProxyWorld) -> None:
    """chat-b needs GPU 4-7: code (GPU 4,5) stops, chat-a hands its route over and stops after."""
    pw.switch("chat-a")
    pw.switch("code")
    dep = pw.switch("chat-b")
    assert dep.phase is Phase.ACTIVE
    assert pw.serving() == ["chat-b"]
    assert pw.host.active_units() == ["vllm-chat-b.service"]


def test_failed_handover_keeps_the_old_model_serving(pw: ProxyWorld) -> None:
    """chat-b never gets ready: rolled back, chat-a never stopped and still routed."""
    pw.switch("chat-a")
    pw.host.behaviours["vllm-chat-b.service"] = "never_ready"
    dep = pw.switch("chat-b")
    assert dep.phase is Phase.ROLLED_BACK
    assert "stop vllm-chat-a.service" not in pw.host.calls
    assert pw.serving() == ["chat-a"]
    assert pw.proxy.routed is not None and "8001" in pw.proxy.routed and "8002" not in pw.proxy.routed


def test_failed_add_rolls_back_to_the_set_without_it(pw: ProxyWorld) -> None:
    """code crashes on start beside chat-a: rolled back, chat-a alone serves and code has no route."""
    pw.switch("chat-a")
    pw.host.behaviours["vllm-code.service"] = "crash"
    dep = pw.switch("code")
    assert dep.phase is Phase.ROLLED_BACK
    assert pw.serving() == ["chat-a"]
    assert pw.proxy.config is not None and "use_backend m2" not in pw.proxy.config
    assert 'use_backend m1 if { var(txn.model) -m str "chat" }' in pw.proxy.config


@pytest.mark.parametrize("stop_at", ["stopping", "checking", "routing"])
def test_interrupted_handover_resumes_to_the_new_set(pw: ProxyWorld, stop_at: str) -> None:
    """A handover parked before STOP_AT and run again ends with chat-b alone, routed."""
    pw.switch("chat-a")
    dep = pw.engine.plan_switch("chat-b")
    assert dep is not None

    def park_at(d: Any) -> None:
        if d.phase.value == stop_at:
            pw.engine.park.set()

    pw.engine.before_step = park_at
    assert pw.engine.run(dep.id).phase.value == stop_at
    pw.engine.park.clear()
    pw.engine.before_step = None
    assert pw.engine.run(dep.id).phase is Phase.ACTIVE
    assert pw.serving() == ["chat-b"]
    assert pw.proxy.routed is not None and "8002" in pw.proxy.routed


def test_taken_proxy_port_aborts_before_anything_stops(pw: ProxyWorld) -> None:
    """The proxy's port held by another process: aborted in preflight, naming the holder."""
    pw.proxy.taken_by = "the proxy's port 0.0.0.0:8000 is already taken by nginx"
    dep = pw.switch("chat-a")
    assert dep.phase is Phase.ABORTED
    assert "already taken by nginx" in (dep.error or "")
    assert pw.host.active_units() == []


def test_rollback_on_failure_off_holds_with_the_proxy_too() -> None:
    """policy.rollback_on_failure = false: a failed add with the front proxy ends failed, not rolled back."""
    catalog = proxy_catalog().model_copy(update={"policy": make_catalog(policy={"rollback_on_failure": False}).policy})
    world = World(catalog)
    proxy = FakeProxy()
    ports = world.host.ports(catalog.hosts["box"], world.weights)
    ports.proxy = proxy
    world.engine = Deployer(catalog, world.store, lambda name: ports)
    world.switch("chat-a")
    world.host.behaviours["vllm-code.service"] = "crash"
    assert world.switch("code").phase is Phase.FAILED


class StagingWatch:
    """Weights that record the proxy's config while they stage, and fail when told to."""

    def __init__(self, pw: ProxyWorld, fail: bool = False) -> None:
        self.pw, self.fail, self.seen = pw, fail, ""
        self.inner = pw.weights

    def stage(self, spec: Any, progress: Any) -> Any:
        self.seen = self.pw.proxy.config or ""
        if self.fail:
            raise WeightsError(f"{spec.model}: no weights at {spec.model_dir}")
        return self.inner.stage(spec, progress)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def watch_staging(pw: ProxyWorld, fail: bool = False) -> StagingWatch:
    """The world's engine from now on stages through a StagingWatch."""
    watch = StagingWatch(pw, fail)
    ports = pw.host.ports(pw.catalog.hosts["box"], watch)  # type: ignore[arg-type]
    ports.proxy = pw.proxy
    pw.engine = Deployer(pw.catalog, pw.store, lambda name: ports, progress=lambda e, f: pw.events.append((e, f)))
    return watch


def test_a_name_nothing_served_answers_loading_from_staging_on(pw: ProxyWorld) -> None:
    """While the first switch to "code" stages its weights (a download can take hours), "code" answers
    503 model_loading, not "not loaded"."""
    pw.switch("chat-a")
    watch = watch_staging(pw)
    assert pw.switch("code").phase is Phase.ACTIVE
    assert '"model_loading"}}\' if { method POST } { var(txn.model) -m str "code" }' in watch.seen


def test_a_switch_aborted_in_staging_takes_the_loading_answer_back(pw: ProxyWorld) -> None:
    """Staging fails: the switch ends aborted and the proxy routes as before, "code" no longer "loading"."""
    pw.switch("chat-a")
    before = pw.proxy.config
    watch = watch_staging(pw, fail=True)
    assert pw.switch("code").phase is Phase.ABORTED
    assert "model_loading" in watch.seen
    assert pw.proxy.config == before and "model_loading" not in (pw.proxy.config or "")


def test_the_loading_answer_comes_first_and_goes_when_preflight_refuses(pw: ProxyWorld) -> None:
    """ "code" answers "loading" from the switch's first step, before its checks; a preflight refusal
    (its GPUs are not there) takes the mark back: the proxy routes as before."""
    pw.switch("chat-a")
    before = pw.proxy.config
    pw.proxy.applied.clear()
    pw.host.gpu_count = 4  # "code" is on GPUs 4 and 5
    assert pw.switch("code").phase is Phase.ABORTED
    assert "model_loading" in pw.proxy.applied[0]
    assert pw.proxy.config == before
