"""The deciding steps' one view of the host (deploy/read_once.py): preflight and staging read each unit
and each engine's sleep state once; whatever the port changes makes it read again."""

from __future__ import annotations

from collections import Counter
from typing import Any

from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.deploy.read_once import read_once
from orchestrator.testing import FakeProxy, FakeResidencyStore

from .test_warm_switch import WarmWorld


class Counting:
    """Counts the reads that reach a port (``reads``: name and argument)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: Counter[tuple[str, str]] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in ("unit_state", "read_unit", "cgroup_pids", "is_sleeping"):
            return attr

        def read(arg: str, *rest: Any, **kw: Any) -> Any:
            self.reads[name, arg] += 1
            return attr(arg, *rest, **kw)

        return read


def deciding_ctx(ww: WarmWorld) -> tuple[Any, Counting, Counting]:
    from orchestrator.deploy.context import StepContext

    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    systemd, control = Counting(ports.systemd), Counting(ports.engine_controls["vllm"])
    ports.systemd, ports.engine_controls = systemd, {"vllm": control}  # type: ignore[assignment]
    ctx = StepContext(ports=ports, catalog=ww.catalog, progress=lambda e, f: None)
    return read_once(ctx), systemd, control


def test_a_unit_read_twice_reaches_the_port_once() -> None:
    """Two reads of one unit's state, file and processes ask systemd once each."""
    ctx, systemd, _ = deciding_ctx(WarmWorld())
    for _ in range(2):
        ctx.ports.systemd.unit_state("vllm-alpha.service")
        ctx.ports.systemd.read_unit("vllm-alpha.service")
        ctx.ports.systemd.cgroup_pids("vllm-alpha.service")
    assert set(systemd.reads.values()) == {1}


def test_a_write_through_the_port_forgets_what_was_read() -> None:
    """After a unit job (here a daemon-reload) the next read asks systemd again."""
    ctx, systemd, _ = deciding_ctx(WarmWorld())
    ctx.ports.systemd.unit_state("vllm-alpha.service")
    ctx.ports.systemd.daemon_reload()
    ctx.ports.systemd.unit_state("vllm-alpha.service")
    assert systemd.reads["unit_state", "vllm-alpha.service"] == 2


def test_an_engines_sleep_state_is_read_again_once_it_slept() -> None:
    """is_sleeping is remembered until the control puts that engine to sleep (or wakes it)."""
    ww = WarmWorld()
    ww.switch("alpha")
    ctx, _, control = deciding_ctx(ww)
    url = f"http://127.0.0.1:{ww.catalog.models['alpha'].port}"
    engine = ctx.ports.engine_controls["vllm"]
    assert engine.is_sleeping(url) is False and engine.is_sleeping(url) is False
    engine.sleep(url, 1)
    assert engine.is_sleeping(url) is True
    assert control.reads["is_sleeping", url] == 2


def test_a_warm_switch_reads_each_unit_once_while_it_decides() -> None:
    """Preflight and staging of a warm switch back to a sleeper ask each unit's state and the target's
    sleep state once in all (they were asked up to six times each before)."""
    ww = WarmWorld()
    ports = ww.host.ports(ww.catalog.hosts["box"], ww.weights)
    ports.proxy = FakeProxy()
    systemd, control = Counting(ports.systemd), Counting(ports.engine_controls["vllm"])
    ports.systemd, ports.engine_controls = systemd, {"vllm": control}  # type: ignore[assignment]
    engine = Deployer(ww.catalog, ww.store, lambda name: ports, residency=FakeResidencyStore())
    for model in ("alpha", "beta"):
        dep = engine.plan_switch(model)
        assert dep is not None and engine.run(dep.id).phase is Phase.ACTIVE
    dep = engine.plan_switch("alpha")
    assert dep is not None
    phases: list[Phase] = []
    reads: Counter[tuple[str, str]] = Counter()

    def hook(d: Any) -> None:
        if phases and phases[-1] in (Phase.PREFLIGHT, Phase.STAGING):
            reads.update(systemd.reads)
            reads.update(control.reads)
        systemd.reads.clear()
        control.reads.clear()
        phases.append(d.phase)

    engine.before_step = hook
    assert engine.run(dep.id).phase is Phase.ACTIVE
    assert {Phase.PREFLIGHT, Phase.STAGING} <= set(phases)
    assert reads and max(reads.values()) == 1, reads
