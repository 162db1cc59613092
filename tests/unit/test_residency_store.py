"""The residency store's SQLite file: states survive a reopen, leaving `serving` stamps last_served."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.adapters.residency_store import SqliteResidencyStore
from orchestrator.errors import StateError


def test_states_survive_a_reopen_with_level_unit_and_size(tmp_path: Path) -> None:
    """What was recorded is what a new process reads back."""
    store = SqliteResidencyStore(tmp_path / "residency.db", group=None)
    store.set_state("box", "alpha", "asleep", 10.0, level="level1", unit="vllm-alpha.service", weights_gib=13.0)
    store.close()
    rec = SqliteResidencyStore(tmp_path / "residency.db", group=None).residency("box")["alpha"]
    assert (rec.state, rec.level, rec.unit, rec.weights_gib, rec.ram_gib) == (
        "asleep",
        "level1",
        "vllm-alpha.service",
        13.0,
        13.0,
    )


def test_leaving_serving_stamps_last_served(tmp_path: Path) -> None:
    """last_served is when the model last served: set while serving and when it leaves; kept after."""
    store = SqliteResidencyStore(tmp_path / "residency.db", group=None)
    store.set_state("box", "alpha", "serving", 5.0)
    store.set_state("box", "alpha", "asleep", 9.0, level="level2")
    store.set_state("box", "alpha", "stopped", 20.0)
    rec = store.residency("box")["alpha"]
    assert (rec.state, rec.last_served, rec.ram_gib) == ("stopped", 9.0, 0.0)


def test_an_unknown_state_is_refused_naming_it(tmp_path: Path) -> None:
    """A state outside serving/asleep/stopped is a StateError naming the model and the value."""
    store = SqliteResidencyStore(tmp_path / "residency.db", group=None)
    with pytest.raises(StateError, match="residency of alpha on box: state 'dozing'"):
        store.set_state("box", "alpha", "dozing", 1.0)


def test_a_file_of_someone_elses_tables_is_refused(tmp_path: Path) -> None:
    """Pointed at another program's SQLite file, the store refuses it instead of adding its table."""
    import sqlite3

    from orchestrator.errors import StateStoreError

    path = tmp_path / "residency.db"
    sqlite3.connect(path).execute("CREATE TABLE things (x)").connection.commit()
    with pytest.raises(StateStoreError, match="not orchestrator's"):
        SqliteResidencyStore(path, group=None)
