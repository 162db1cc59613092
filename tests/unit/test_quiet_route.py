"""A warm switch moves its route at a quiet moment of the engines it displaces (core/quiet.py,
actions.await_quiet): none in flight to them, or ``[proxy] quiet_wait_s`` passed; on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.progress_text import warm_line
from orchestrator.core.quiet import QUIET_POLL_S, verdict
from orchestrator.core.states import Phase
from orchestrator.deploy.deployer import Deployer
from orchestrator.errors import ProxyError
from orchestrator.testing import FakeProxy, FakeResidencyStore

from .conftest import World
from .test_warm_switch import TP4, warm_catalog

BETA = ("127.0.0.1", 8002)  # the displaced engine of alpha -> beta -> alpha
OTHER = ("127.0.0.1", 8003)


def counted(n: int, engine: tuple[str, int] = BETA) -> dict[tuple[str, int], Sessions]:
    return {engine: Sessions(current=n, idle_s=0.0)}


def test_none_in_flight_moves_the_route_at_once() -> None:
    """A reading of no session to the displaced engines: the route moves, whatever was waited."""
    assert verdict(counted(0), [BETA], 0.0, 2.0) == verdict(counted(0), [BETA], 5.0, 2.0)
    assert verdict(counted(0), [BETA], 0.0, 2.0).move and verdict(counted(0), [BETA], 0.0, 2.0).outcome == "quiet"


def test_a_request_in_flight_under_the_bound_waits() -> None:
    """One session (a stream, a short request: no age tells them apart) before the bound: read again."""
    got = verdict(counted(1), [BETA], 1.99, 2.0)
    assert (got.move, got.outcome, got.in_flight) == (False, "waiting", 1)


def test_at_the_bound_the_route_moves_with_what_is_left_in_flight() -> None:
    """quiet_wait_s reached with sessions left: the route moves anyway, and says how many."""
    got = verdict(counted(3), [BETA], 2.0, 2.0)
    assert (got.move, got.outcome, got.in_flight) == (True, "bound", 3)


def test_no_count_from_the_proxy_moves_the_route_at_once() -> None:
    """No master answered (None): waiting blind would only delay the switch."""
    got = verdict(None, [BETA], 0.0, 2.0)
    assert (got.move, got.outcome) == (True, "unknown")


def test_sessions_count_only_at_the_displaced_engines() -> None:
    """Another engine's sessions hold nothing; one the proxy has no server for has none through it."""
    both = {**counted(4, OTHER), **counted(0)}
    assert verdict(both, [BETA], 0.0, 2.0).outcome == "quiet"
    assert verdict(counted(2, OTHER), [BETA], 0.0, 2.0).outcome == "quiet"
    assert verdict({**counted(1), **counted(2, OTHER)}, [BETA, OTHER], 0.0, 2.0).in_flight == 3


class ScriptedProxy(FakeProxy):
    """Counts beta's sessions from a script (then 0), noting at each reading the fake clock and whether
    the route had moved off beta yet (to alpha, or beta withdrawn); ``raises``: the master gives no answer.
    The drain reads them too, once the route moved (what the running worker still has at beta)."""

    def __init__(self, world: QuietWorld) -> None:
        super().__init__()
        self.world, self.script, self.raises = world, list[int](), False
        self.readings: list[tuple[float, int, bool]] = []

    def sessions(self, engines: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        if self.raises:
            raise ProxyError("HAProxy's master CLI gave no `show stat`", host="box")
        n = self.script.pop(0) if self.script else 0
        routed_alpha = self.routed is not None and ":8001" in self.routed and ":8002" not in self.routed
        self.readings.append((self.world.host.clock.monotonic(), n, routed_alpha or BETA in self.withdrawn))
        return {e: Sessions(current=n if e == BETA else 0, idle_s=0.0) for e in engines}


class QuietWorld(World):
    """alpha -> beta done (alpha asleep, beta serving): ``back()`` is the warm switch to alpha."""

    def __init__(self, quiet_wait_s: float = 2.0, **models: Any) -> None:
        catalog = warm_catalog(**models)
        catalog = catalog.model_copy(update={"proxy": catalog.proxy.model_copy(update={"quiet_wait_s": quiet_wait_s})})
        super().__init__(catalog)
        self.proxy = ScriptedProxy(self)
        self.residency = FakeResidencyStore()
        ports = self.host.ports(self.catalog.hosts["box"], self.weights)
        ports.proxy = self.proxy
        self.engine = Deployer(
            self.catalog,
            self.store,
            lambda name: ports,
            residency=self.residency,
            progress=lambda e, f: self.events.append((e, f)),
        )
        self.switch("alpha")
        self.switch("beta")
        self.proxy.readings.clear()

    def quiet_notes(self, dep_id: int) -> list[dict[str, Any]]:
        return [
            e
            for e in self.store.events(kind="warm", limit=500)
            if e.get("step") == "quiet" and e["deployment_id"] == dep_id
        ]


def test_the_route_moves_at_the_first_reading_with_nothing_in_flight() -> None:
    """beta runs a request for three readings: the route stays on beta until the fourth reads none,
    10 ms apart on the fake clock, and the wait is kept with the deployment."""
    qw = QuietWorld()
    qw.proxy.script = [1, 2, 1, 0]
    back = qw.switch("alpha")
    assert back.phase is Phase.ACTIVE
    waits = [(n, moved) for _, n, moved in qw.proxy.readings]
    assert waits[:4] == [(1, False), (2, False), (1, False), (0, False)] and all(m for _, m in waits[4:])
    assert qw.proxy.readings[3][0] - qw.proxy.readings[0][0] == pytest.approx(3 * QUIET_POLL_S)
    [note] = qw.quiet_notes(back.id)
    assert (note["phase"], note["outcome"], note["in_flight"], note["seconds"]) == ("sleeping", "quiet", 0, 0.03)


def test_a_displaced_engine_never_quiet_keeps_its_route_for_quiet_wait_s_and_no_longer() -> None:
    """Sessions at every reading: the route moves at the reading at quiet_wait_s (1.5 s here), with
    what is left in flight named; the drain and the sleep then wait for it as without the wait."""
    qw = QuietWorld(quiet_wait_s=1.5)
    qw.proxy.script = [1] * 1000
    back = qw.switch("alpha")
    assert back.phase is Phase.ACTIVE
    before = [r for r in qw.proxy.readings if not r[2]]
    assert before[-1][0] - before[0][0] == pytest.approx(1.5)
    assert all(moved for _, _, moved in qw.proxy.readings[len(before) :])
    [note] = qw.quiet_notes(back.id)
    assert (note["outcome"], note["in_flight"], note["seconds"]) == ("bound", 1, 1.5)
    assert "sleep vllm-beta.service level=1 mode=wait" in qw.host.calls


def test_a_proxy_without_an_answer_does_not_hold_the_route() -> None:
    """The master CLI gives no count: one reading, then the route moves as it would without the wait."""
    qw = QuietWorld()
    qw.proxy.raises = True
    back = qw.switch("alpha")
    assert back.phase is Phase.ACTIVE
    [note] = qw.quiet_notes(back.id)
    assert (note["outcome"], note["seconds"]) == ("unknown", 0)


def test_a_proxy_without_an_answer_does_not_hold_the_drain_either() -> None:
    """No count from the master after the route moved: the old workers' 0 stands, the drain ends at once
    (a proxy that gives no figures has nothing in flight to wait for)."""
    qw = QuietWorld()
    qw.proxy.raises = True
    assert qw.switch("alpha").phase is Phase.ACTIVE
    [drained] = [f for e, f in qw.events if e == "drained" and f.get("engines") == ["127.0.0.1:8002"]][-1:]
    assert (drained["seconds"], drained["still_draining"]) == (0, 0)


def test_quiet_wait_s_zero_moves_the_route_without_reading() -> None:
    """[proxy] quiet_wait_s = 0: no reading, no note; the switch is the one before the wait existed."""
    qw = QuietWorld(quiet_wait_s=0)
    qw.proxy.script = [5]
    back = qw.switch("alpha")
    assert back.phase is Phase.ACTIVE
    assert all(moved for _, _, moved in qw.proxy.readings) and qw.quiet_notes(back.id) == []


def test_a_target_on_demand_does_not_wait() -> None:
    """An on-demand swap's requests are held from their arrival: the wait would be theirs, so beta's
    route goes first (withdrawn) and only its drain counts what it still runs."""
    models = {
        "alpha": {"repo": "org/alpha", "port": 8001, **TP4, "on_demand": True, "served_name": "alpha"},
        "beta": {"repo": "org/beta", "port": 8002, **TP4, "served_name": "beta"},
    }
    qw = QuietWorld(**models)
    qw.proxy.script = [1, 1, 0]
    back = qw.switch("alpha")
    assert back.phase is Phase.ACTIVE
    assert qw.proxy.readings and all(moved for _, _, moved in qw.proxy.readings)
    assert qw.quiet_notes(back.id) == []


def test_a_run_stopped_during_the_wait_left_the_route_and_resumes_to_the_switch() -> None:
    """The agent stops mid-wait (parked at a pause): the route still points at beta, beta serves
    awake; the run resumed waits again and ends with alpha serving and beta asleep."""
    qw = QuietWorld()
    qw.proxy.script = [1, 1, 1]
    dep = qw.engine.plan_switch("alpha")
    assert dep is not None
    qw.host.clock.on_sleep.append(lambda: qw.engine.park.set() if len(qw.proxy.readings) == 2 else None)
    assert qw.engine.run(dep.id).phase is Phase.SLEEPING
    assert qw.proxy.routed is not None and ":8002" in qw.proxy.routed and ":8001" not in qw.proxy.routed
    assert "vllm-beta.service" not in qw.host.sleeping and "vllm-beta.service" in qw.host.active_units()
    qw.host.clock.on_sleep.clear()
    qw.engine.park.clear()
    assert qw.engine.run(dep.id).phase is Phase.ACTIVE
    assert {m: r.state for m, r in qw.residency.residency("box").items()} == {"alpha": "serving", "beta": "asleep"}
    assert [n["outcome"] for n in qw.quiet_notes(dep.id)] == ["quiet"]


def test_the_wait_reads_as_one_progress_line() -> None:
    """The CLI's and the dashboard's line for the wait: how long, which engines, what followed."""
    text, _ = warm_line(
        "quiet", {"seconds": 0.03, "engines": ["127.0.0.1:8002"], "result": "nothing in flight: the route moves"}
    )
    assert text == (
        "waited 0.03 s for a moment with no request in flight to ['127.0.0.1:8002']: nothing in flight: the route moves"
    )


def _ops(qw: QuietWorld) -> Any:
    from orchestrator.deploy.operations import Operations

    ports = qw.host.ports(qw.catalog.hosts["box"], qw.weights)
    ports.proxy = qw.proxy
    return Operations(qw.catalog, lambda name: ports, store=qw.store, residency=qw.residency)


def test_a_warm_rollback_waits_for_the_same_quiet_moment() -> None:
    """`rollback` to the model asleep since the last switch is the same warm path: the route stays on
    beta while it has a request in flight."""
    qw = QuietWorld()
    qw.proxy.script = [1, 0]
    result = _ops(qw).rollback("box")
    assert result["outcome"] == "active" and result["model"] == "alpha"
    assert [(n, moved) for _, n, moved in qw.proxy.readings if not moved] == [(1, False), (0, False)]
    assert [n["outcome"] for n in qw.quiet_notes(result["id"])] == ["quiet"]


def test_history_shows_how_long_the_route_waited(monkeypatch: pytest.MonkeyPatch) -> None:
    """`history` adds the wait to the warm switch's phases, and what was left in flight at the bound."""
    from click.testing import CliRunner

    from orchestrator.cli import deploy_cmds

    qw = QuietWorld(quiet_wait_s=0.5)
    qw.proxy.script = [2] * 1000
    qw.switch("alpha")
    rows = _ops(qw).history("box")
    assert rows[0]["quiet"] == {"seconds": 0.5, "outcome": "bound", "in_flight": 2}

    class Rows:
        def call(self, *args: Any, **kw: Any) -> Any:
            return rows

    monkeypatch.setattr(deploy_cmds, "backend", lambda *a, **kw: Rows())
    out = CliRunner().invoke(deploy_cmds.history, ["--on", "box"], terminal_width=400).output
    assert out.count("route waited 0.50 for quiet, 2 still in flight") == 1
