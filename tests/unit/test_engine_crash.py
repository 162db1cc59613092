"""The crash matrix of a deployment's end: the process dies before any store write from `routing` on.

Whatever write the crash precedes, the state file never says "ended" while the serving pointer
still names what served before: recovery (the next engine over the same file) either re-runs the
step, or finds the outcome and the pointer written together.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.records import Deployment
from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.testing import FakeHost, FakeWeights

from .conftest import make_catalog

WRITES = frozenset(
    {
        "create",
        "transition",
        "update_spec",
        "record_error",
        "move_serving",
        "record_plan",
        "record_bench",
        "record_event",
    }
)


class Crash(BaseException):
    """The process dies here: a BaseException, so no handler of the engine sees it."""


class CrashingStore:
    """The real SQLite store, dying before its n-th write once armed."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        self.left: int | None = None  # writes still allowed; None: not armed

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name not in WRITES:
            return attr

        def write(*args: Any, **kwargs: Any) -> Any:
            if self.left == 0:
                raise Crash(name)
            if self.left is not None:
                self.left -= 1
            return attr(*args, **kwargs)

        return write


def engine(store: Any, host: FakeHost) -> Deployer:
    catalog = make_catalog()
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    return Deployer(catalog, store, lambda name: ports)


@pytest.mark.parametrize("writes_before_crash", range(4))
@pytest.mark.parametrize("ending", ["active", "failed"])
def test_a_crash_at_the_end_never_splits_outcome_and_serving(
    tmp_path: Path, ending: str, writes_before_crash: int
) -> None:
    """Crash before the k-th write from `routing` on; after recovery the pointer matches the outcome."""
    host = FakeHost(name="box")
    store = CrashingStore(SqliteStore(tmp_path / "state.db", group=None))
    eng = engine(store, host)
    first = eng.plan_switch("alpha")
    assert first is not None and eng.run(first.id).phase is Phase.ACTIVE
    if ending == "failed":  # beta's start fails and there is no rollback: nothing is known to serve
        host.behaviours["vllm-beta.service"] = "crash"
    dep = eng.plan_switch("beta", no_rollback=ending == "failed")
    assert dep is not None

    def arm(d: Deployment) -> None:
        if store.left is None and d.phase in (Phase.ROUTING, Phase.STARTING):
            store.left = writes_before_crash

    eng.before_step = arm
    try:
        eng.run(dep.id)
    except Crash:
        pass
    store.store.close()

    reopened = SqliteStore(tmp_path / "state.db", group=None)
    recovery = engine(reopened, host)
    for unfinished in reopened.unfinished("box"):
        recovery.run(unfinished.id)
    final = reopened.get(dep.id)
    serving = reopened.serving("box")
    assert final.phase.value == ending
    assert (serving.revision if serving else None) == (dep.revision if ending == "active" else None)


@pytest.mark.parametrize("writes_before_crash", range(3))
def test_a_crash_while_planning_a_proxy_switch_never_leaves_it_without_its_plan(
    tmp_path: Path, writes_before_crash: int
) -> None:
    """A deployment recorded without its plan would run as a one-model switch: created with it, or not at all."""
    from orchestrator.testing import FakeProxy

    from .test_proxy_engine import proxy_catalog

    host = FakeHost(name="box")
    store = CrashingStore(SqliteStore(tmp_path / "state.db", group=None))
    catalog = proxy_catalog()
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    ports.proxy = FakeProxy()
    eng = Deployer(catalog, store, lambda name: ports)
    first = eng.plan_switch("chat-a")
    assert first is not None and eng.run(first.id).phase is Phase.ACTIVE
    store.left = writes_before_crash
    try:
        eng.plan_switch("code")
    except Crash:
        pass
    store.store.close()

    reopened = SqliteStore(tmp_path / "state.db", group=None)
    for unfinished in reopened.unfinished("box"):
        assert reopened.plan_of(unfinished.id) is not None
        Deployer(catalog, reopened, lambda name: ports).run(unfinished.id)
    served = sorted(d.model for d in reopened.serving_set("box"))
    assert served in (["chat-a"], ["chat-a", "code"])


@pytest.mark.parametrize("writes_before_crash", range(3))
def test_a_crash_while_stopping_a_model_never_splits_pointer_and_set(tmp_path: Path, writes_before_crash: int) -> None:
    """`stop` of the model the pointer names: after a crash at any write, pointer and set agree."""
    from orchestrator.deploy.operations import Operations
    from orchestrator.testing import FakeProxy

    from .test_proxy_engine import proxy_catalog

    host = FakeHost(name="box")
    store = CrashingStore(SqliteStore(tmp_path / "state.db", group=None))
    catalog = proxy_catalog().model_copy(update={"state_dir": str(tmp_path / "state")})
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    ports.proxy = FakeProxy()
    ops = Operations(catalog, lambda name: ports, store=store)  # type: ignore[arg-type]
    ops.switch("chat-a")
    ops.switch("code")
    store.left = writes_before_crash
    try:
        ops.stop("code")
    except Crash:
        pass
    store.store.close()

    reopened = SqliteStore(tmp_path / "state.db", group=None)
    pointer = reopened.serving("box")
    in_set = {d.revision for d in reopened.serving_set("box")}
    assert pointer is None or pointer.revision in in_set


class CrashingControl:
    """The fake engine control, killing the agent right after its n-th call returned (the engine
    acted: slept, woke) once armed: the crash falls between an engine's change and its record."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.left: int | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            if self.left is not None:
                if self.left == 0:
                    self.left = None
                    raise Crash(name)
                self.left -= 1
            return out

        return call


WARM_CASES = {
    "warm": {},
    "wedged": {"vllm-alpha.service": "wedged_wake"},
    "rollback": {"vllm-alpha.service": "wedged_wake"},
}  # and alpha's cold restart fails


# (case, where): after the n-th engine call (7 in a warm switch, 5 up to a wedged wake), or as a phase begins.
WARM_CRASHES = (
    [("warm", n) for n in range(7)]
    + [("wedged", n) for n in range(5)]
    + [("warm", p) for p in (Phase.SLEEPING, Phase.VERIFYING, Phase.WAKING, Phase.ROUTING)]
    + [("wedged", p) for p in (Phase.RESTARTING, Phase.CHECKING, Phase.ROUTING)]
    + [("rollback", n) for n in range(6, 9)]
    + [("rollback", Phase.ROLLING_BACK)]
)


@pytest.mark.parametrize(("case", "where"), WARM_CRASHES)
def test_the_agent_killed_in_a_warm_switch_converges(tmp_path: Path, case: str, where: int | Phase) -> None:
    """Killed after any engine call of a warm switch back to alpha (sleep, wake, is_sleeping, the
    completion) or as any of its phases begins (a wedged wake's restart, a warm rollback too), the
    resumed run ends as an uninterrupted one: active (alpha serves awake, beta sleeps) or rolled back
    (beta serves awake, alpha stopped), the GPUs holding the server's engine and a sleeper's residue."""
    from orchestrator.adapters.residency_store import SqliteResidencyStore
    from orchestrator.testing import FakeProxy

    from .test_warm_switch import warm_catalog

    host = FakeHost(name="box")
    catalog = warm_catalog()
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    ports.proxy = FakeProxy()
    control = CrashingControl(ports.engine_controls["vllm"])
    ports.engine_controls = {"vllm": control}

    def open_engine() -> tuple[Deployer, SqliteStore, SqliteResidencyStore]:
        store = SqliteStore(tmp_path / "state.db", group=None)
        residency = SqliteResidencyStore(tmp_path / "residency.db", group=None)
        return Deployer(catalog, store, lambda name: ports, residency=residency), store, residency

    eng, store, residency = open_engine()
    for model in ("alpha", "beta"):
        dep = eng.plan_switch(model)
        assert dep is not None and eng.run(dep.id).phase is Phase.ACTIVE
    host.engine_behaviours.update(WARM_CASES[case])  # type: ignore[arg-type]
    if case == "rollback":
        host.behaviours["vllm-alpha.service"] = "crash"
    dep = eng.plan_switch("alpha")
    assert dep is not None
    if isinstance(where, int):
        control.left = where
    else:

        def die(d: Deployment) -> None:
            if d.phase is where:
                raise Crash(where.value)

        eng.before_step = die
    with pytest.raises(Crash):
        eng.run(dep.id)
    control.left = None
    store.close()
    residency.close()

    eng, store, residency = open_engine()
    for unfinished in store.unfinished("box"):
        eng.run(unfinished.id)
    states = {m: r.state for m, r in residency.residency("box").items()}
    beta_url = f"http://127.0.0.1:{catalog.models['beta'].port}"
    held = sorted(mib for _, mib, _, _ in host.holders.values())
    if case == "rollback":
        assert store.get(dep.id).phase is Phase.ROLLED_BACK
        assert states == {"alpha": "stopped", "beta": "serving"} and not control.inner.is_sleeping(beta_url)
        assert held == [70_000]
        return
    assert store.get(dep.id).phase is Phase.ACTIVE
    assert states == {"alpha": "serving", "beta": "asleep"} and control.inner.is_sleeping(beta_url)
    assert not control.inner.is_sleeping(f"http://127.0.0.1:{catalog.models['alpha'].port}")
    assert held == [host.residue_mib, 70_000]
