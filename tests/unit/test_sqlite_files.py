"""The rollout store and the config revisions: every SQLite failure is a StateError naming the file,
the rollout file carries a schema version, and a push's file and revision go in together."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.agent.config_ops import ConfigRevisions
from orchestrator.core.rollout import Policy
from orchestrator.errors import StateError, StateStoreError
from orchestrator.rollout.store import ROLLOUT_SCHEMA_VERSION, RolloutStore

POLICY = Policy(canary=1, batch=1, max_failures=0, rollback_all=False)


def test_a_fresh_rollout_file_is_stamped_with_its_schema_version(tmp_path: Path) -> None:
    """rollouts.db gets PRAGMA user_version, as state.db does."""
    RolloutStore(tmp_path / "rollouts.db", group=None).close()
    version = sqlite3.connect(tmp_path / "rollouts.db").execute("PRAGMA user_version").fetchone()[0]
    assert version == ROLLOUT_SCHEMA_VERSION >= 1


def test_a_newer_rollout_file_is_refused_naming_it_and_both_versions(tmp_path: Path) -> None:
    """A rollouts.db from a newer orchestrator is refused (exit 2) before anything reads it."""
    path = tmp_path / "rollouts.db"
    RolloutStore(path, group=None).close()
    sqlite3.connect(path).execute(f"PRAGMA user_version = {ROLLOUT_SCHEMA_VERSION + 1}")
    with pytest.raises(
        StateStoreError,
        match=rf"rollout store {path}: schema version {ROLLOUT_SCHEMA_VERSION + 1} "
        r"is newer than this orchestrator supports "
        rf"\({ROLLOUT_SCHEMA_VERSION}\)",
    ):
        RolloutStore(path, group=None)


def test_an_unversioned_rollout_file_is_adopted_with_its_rollouts(tmp_path: Path) -> None:
    """A rollouts.db written before the version (tables, user_version 0) keeps its rollouts and is stamped."""
    from orchestrator.rollout import store as rollout_store

    path = tmp_path / "rollouts.db"
    db = sqlite3.connect(path)
    for statement in rollout_store._V1:
        db.execute(statement)
    db.execute(
        "INSERT INTO rollouts (model, grp, status, canary, batch, max_failures, rollback_all, gate, "
        "started_at) VALUES ('m', 'g', 'running', 1, 1, 0, 0, 'none', 1.0)"
    )
    db.commit()
    db.close()
    store = RolloutStore(path, group=None)
    assert [r.model for r in store.unfinished()] == ["m"]
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == ROLLOUT_SCHEMA_VERSION


def test_a_failed_rollout_write_is_a_state_error_naming_the_file(tmp_path: Path) -> None:
    """SQLite refusing a write after the open reaches the user as StateError naming rollouts.db."""
    path = tmp_path / "rollouts.db"
    store = RolloutStore(path, group=None)
    sqlite3.connect(path).executescript(
        "CREATE TRIGGER full BEFORE INSERT ON rollouts BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;"
    )
    with pytest.raises(StateError, match=rf"rollout store {path}: database or disk is full"):
        store.create("m", "g", POLICY, "none", [("box",)], pid=1)
    assert store.latest() is None


def revisions(tmp_path: Path) -> tuple[ConfigRevisions, Path]:
    config = tmp_path / "deploy.toml"
    config.write_text("# first\n")
    return ConfigRevisions(config, str(tmp_path / "state"), group=None), config


def refuse_revisions(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state" / "state.db")
    db.executescript(
        "CREATE TRIGGER full BEFORE INSERT ON config_revisions "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;"
    )
    db.close()


def test_a_failed_config_revision_write_is_a_state_error_naming_state_db(tmp_path: Path) -> None:
    """Recording a config revision that SQLite refuses raises StateError naming the state file."""
    configs, _ = revisions(tmp_path)
    refuse_revisions(tmp_path)
    (tmp_path / "deploy.toml").write_text("# edited\n")
    with pytest.raises(StateError, match=rf"state store {tmp_path / 'state' / 'state.db'}: database or disk is full"):
        configs.record_if_new("agent start")


def test_a_push_whose_revision_cannot_be_recorded_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """replace records the revision and swaps the file as one unit: a refused record changes no file."""
    configs, config = revisions(tmp_path)
    first = configs.record_if_new("agent start")
    refuse_revisions(tmp_path)
    with pytest.raises(StateError, match="database or disk is full"):
        configs.replace("# pushed\n", "alice")
    assert config.read_text() == "# first\n"
    assert configs.current() == (first, "# first\n")
