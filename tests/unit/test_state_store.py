"""One contract for the StateStore port: the SQLite adapter and the in-memory fake behave alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.records import ServingChange, UnitSpec
from orchestrator.core.states import Phase
from orchestrator.errors import StateError
from orchestrator.ports import StateStore
from orchestrator.testing import FakeStateStore


def spec(model: str = "alpha") -> UnitSpec:
    return UnitSpec(
        model=model,
        unit_name=f"vllm-{model}.service",
        unit_text="[Service]\n",
        unit_sha="ab" * 32,
        served_name=model,
        address="127.0.0.1",
        port=8000,
        gpus=(0, 1),
        load_deadline_s=60,
        model_dir=f"/models/{model}",
    )


@pytest.fixture(params=["sqlite", "fake"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    if request.param == "sqlite":
        db = SqliteStore(tmp_path / "state.db", group=None)
        yield db
        db.close()
    else:
        yield FakeStateStore()


def test_revisions_count_per_host(store: StateStore) -> None:
    """Each host numbers its own revisions from 1."""
    a1 = store.create("a", spec(), "t", None, 1.0)
    b1 = store.create("b", spec(), "t", None, 2.0)
    a2 = store.create("a", spec("beta"), "t", a1.revision, 3.0)
    assert (a1.revision, b1.revision, a2.revision) == (1, 1, 2)
    assert store.by_revision("a", 2).model == "beta"


def test_transitions_give_phase_timings_and_end_time(store: StateStore) -> None:
    """Every phase left has a duration; a terminal phase sets ended_at and adds no timing."""
    dep = store.create("a", spec(), "t", None, 10.0)
    store.transition(dep.id, Phase.PREFLIGHT, 11.0)
    store.transition(dep.id, Phase.ABORTED, 13.5)
    got = store.get(dep.id)
    assert got.phase is Phase.ABORTED and got.ended_at == 13.5
    assert [(t.phase, t.seconds) for t in got.timings] == [("planned", 1.0), ("preflight", 2.5)]


def test_unfinished_and_serving_follow_the_records(store: StateStore) -> None:
    """A deployment is unfinished until terminal; serving is the pointer the engine sets."""
    dep = store.create("a", spec(), "t", None, 1.0)
    assert [d.id for d in store.unfinished("a")] == [dep.id] and store.serving("a") is None
    store.transition(dep.id, Phase.ACTIVE, 2.0)
    store.move_serving(ServingChange(pointers=(("a", dep.revision),)))
    assert store.unfinished("a") == [] and store.serving("a") == store.get(dep.id)


def test_an_outcome_moves_the_serving_pointers_and_set_with_it(store: StateStore) -> None:
    """A transition given a ServingChange enters the phase and moves pointer and set in one write."""
    old = store.create("a", spec(), "t", None, 1.0)
    store.move_serving(ServingChange(pointers=(("b", 7),)))
    dep = store.create("a", spec("beta"), "t", old.revision, 2.0)
    store.transition(
        dep.id,
        Phase.ACTIVE,
        3.0,
        ServingChange(pointers=(("b", None), ("a", dep.revision)), sets=(("a", (old.revision, dep.revision)),)),
    )
    assert store.get(dep.id).phase is Phase.ACTIVE
    assert store.serving("a") == store.get(dep.id) and store.serving("b") is None
    assert [d.revision for d in store.serving_set("a")] == [old.revision, dep.revision]


def test_errors_bench_and_spec_updates_are_kept(store: StateStore) -> None:
    """What the engine persists after a step reads back unchanged."""
    dep = store.create("a", spec(), "t", None, 1.0, no_rollback=True)
    store.record_error(dep.id, error="checking: boom")
    store.record_error(dep.id, rollback_error="rollback: worse")
    store.record_bench(dep.id, {"headline_tok_s": 12.5})
    store.update_spec(dep.id, spec("beta"))
    got = store.get(dep.id)
    assert (got.error, got.rollback_error, got.bench, got.model, got.no_rollback) == (
        "checking: boom",
        "rollback: worse",
        {"headline_tok_s": 12.5},
        "beta",
        True,
    )


def test_history_is_newest_first_and_limited(store: StateStore) -> None:
    """History lists the newest deployments first, per host or all, up to the limit."""
    for i in range(3):
        store.create("a", spec(), f"t{i}", None, float(i))
    store.create("b", spec(), "tb", None, 9.0)
    assert [d.trigger for d in store.history("a", limit=2)] == ["t2", "t1"]
    assert [d.trigger for d in store.history()][:1] == ["tb"]


def test_events_filter_by_host_and_kind(store: StateStore) -> None:
    """Events read back newest first, filtered by host and kind."""
    store.record_event(1.0, "a", "watch", {"n": 1})
    store.record_event(2.0, "b", "watch", {"n": 2})
    store.record_event(3.0, "a", "schedule", {"n": 3})
    assert [e["n"] for e in store.events(host="a")] == [3, 1]
    assert [e["n"] for e in store.events(kind="watch")] == [2, 1]


def test_unknown_deployment_is_a_state_error(store: StateStore) -> None:
    """Reading a deployment or revision that does not exist names it."""
    with pytest.raises(StateError, match="#42"):
        store.get(42)
    with pytest.raises(StateError, match="no revision 7"):
        store.by_revision("a", 7)
