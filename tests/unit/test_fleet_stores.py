"""The rollout and tune stores' contract (ports.RolloutStore, ports.TuneStore): the SQLite files and
the in-memory fakes the controller's unit tests use answer alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.adapters.tune_store import TuneStore
from orchestrator.core.rollout import HostState, Policy, RolloutStatus
from orchestrator.core.tune_records import TuneResult
from orchestrator.errors import StateError
from orchestrator.rollout.store import RolloutStore
from orchestrator.testing import FakeRolloutStore, FakeTuneStore


@pytest.fixture(params=["sqlite", "fake"])
def rollouts(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    return RolloutStore(tmp_path / "rollouts.db", group=None) if request.param == "sqlite" else FakeRolloutStore()


@pytest.fixture(params=["sqlite", "fake"])
def tunes(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "fake":
        return FakeTuneStore()
    SqliteStore(tmp_path / "state.db", group=None)  # creates the tune tables (schema version 3)
    return TuneStore(tmp_path / "state.db", group=None)


def test_a_rollout_keeps_its_batches_host_states_and_who_started_it(rollouts: Any) -> None:
    """create, set_host, finish: the record reads back the same, in batch order, started_by kept."""
    rid = rollouts.create(
        "beta",
        "inference",
        Policy(canary=1, batch=2),
        "health",
        [("h1",), ("h2", "h3")],
        7,
        started_by="alice@ssh:10.0.0.1",
        at=100.0,
    )
    rollouts.set_host(rid, "h1", state=HostState.SWITCHED, outcome="active", switched_at=101.0, ended_at=102.0)
    assert [(r.host, r.batch, r.state) for r in rollouts.hosts(rid)] == [
        ("h1", 0, HostState.SWITCHED),
        ("h2", 1, HostState.PENDING),
        ("h3", 1, HostState.PENDING),
    ]
    assert rollouts.host_times(rid)["h1"] == (101.0, 102.0)
    assert [r.id for r in rollouts.unfinished()] == [rid]
    rollouts.finish(rid, RolloutStatus.SUCCEEDED, None, 103.0)
    ro = rollouts.get(rid)
    assert (ro.status, ro.started_by, ro.started_at, ro.ended_at) == (
        RolloutStatus.SUCCEEDED,
        "alice@ssh:10.0.0.1",
        100.0,
        103.0,
    )
    assert rollouts.unfinished() == [] and rollouts.latest() == ro


def test_recent_reads_the_newest_rollouts_first_of_one_group_or_of_all(rollouts: Any) -> None:
    """recent(N) is the newest N, newest first, ended or not; with a group, only that group's."""
    ids = [rollouts.create("beta", g, Policy(), "health", [("h1",)], 7) for g in ("a", "b", "a", "a")]
    rollouts.finish(ids[0], RolloutStatus.SUCCEEDED, None, 1.0)
    assert [r.id for r in rollouts.recent(3)] == [ids[3], ids[2], ids[1]]
    assert [r.id for r in rollouts.recent(5, "a")] == [ids[3], ids[2], ids[0]]
    assert rollouts.recent(2, "nobody") == []


def test_set_hosts_records_many_hosts_together_or_none_of_them(rollouts: Any) -> None:
    """set_hosts writes every host's fields; one unknown field refuses the whole call, nothing written."""
    rid = rollouts.create("beta", "inference", Policy(batch=2), "health", [("h1", "h2")], 7)
    rollouts.set_hosts(
        rid,
        {
            "h1": {"state": HostState.SWITCHING, "switched_at": 5.0},
            "h2": {"state": HostState.SWITCHING, "switched_at": 6.0},
        },
    )
    assert [r.state for r in rollouts.hosts(rid)] == [HostState.SWITCHING] * 2
    with pytest.raises(StateError, match="no host field 'bogus'"):
        rollouts.set_hosts(rid, {"h1": {"state": HostState.SWITCHED}, "h2": {"bogus": 1}})
    assert [r.state for r in rollouts.hosts(rid)] == [HostState.SWITCHING] * 2
    assert rollouts.host_times(rid) == {"h1": (5.0, None), "h2": (6.0, None)}


def test_an_unknown_rollout_or_host_field_is_a_state_error(rollouts: Any) -> None:
    """get of a missing id and a host field that does not exist both raise StateError naming them."""
    rid = rollouts.create("beta", "inference", Policy(), "none", [("h1",)], 7)
    with pytest.raises(StateError, match="no rollout #99"):
        rollouts.get(99)
    with pytest.raises(StateError, match="no host field 'colour'"):
        rollouts.set_host(rid, "h1", colour="red")


def test_a_tune_run_keeps_each_result_and_its_end(tunes: Any) -> None:
    """create, record, finish: unfinished until finished; results in the order measured; done runs listed."""
    run = tunes.create("box", "alpha", {"candidates": 2}, 3, 10.0)
    assert tunes.unfinished("box") == run
    tunes.record(TuneResult(run.id, "tp4", "tp4", "ok", 5, 4, None, None, [{"tok_s": 1.0}], 11.0))
    tunes.record(TuneResult(run.id, "tp8", "tp8", "failed", None, None, "oom", "oom!", [], 12.0))
    assert [r.candidate for r in tunes.results(run.id)] == ["tp4", "tp8"]
    tunes.finish(run.id, "done", 13.0, {"winner": "tp4"})
    assert tunes.unfinished("box") is None
    assert [(r.id, r.result) for r in tunes.finished("box")] == [(run.id, {"winner": "tp4"})]
