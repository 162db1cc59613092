"""The SQLite state store: schema version and migrations, clean refusals of odd files, private modes."""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.adapters.state_schema import SCHEMA_VERSION
from orchestrator.core.records import UnitSpec
from orchestrator.core.states import Phase
from orchestrator.errors import StateStoreError

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
# The schema as first landed (commit aabdd0a), when the file carried no version.
LANDED = """
CREATE TABLE deployments (id INTEGER PRIMARY KEY AUTOINCREMENT, host TEXT NOT NULL, revision INTEGER NOT NULL,
  spec TEXT NOT NULL, trigger TEXT NOT NULL, phase TEXT NOT NULL, created_at REAL NOT NULL,
  previous_revision INTEGER, ended_at REAL, error TEXT, rollback_error TEXT,
  no_rollback INTEGER NOT NULL DEFAULT 0, bench TEXT, UNIQUE (host, revision));
CREATE TABLE transitions (deployment_id INTEGER NOT NULL REFERENCES deployments(id), phase TEXT NOT NULL,
  at REAL NOT NULL);
CREATE TABLE serving (host TEXT PRIMARY KEY, revision INTEGER);
CREATE TABLE events (at REAL NOT NULL, host TEXT, kind TEXT NOT NULL, detail TEXT NOT NULL);
"""
SPEC = UnitSpec(
    model="a",
    unit_name="vllm-a.service",
    unit_text="[Service]\n",
    unit_sha="ab" * 32,
    served_name="a",
    address="127.0.0.1",
    port=8000,
    gpus=(0,),
    load_deadline_s=60.0,
    model_dir="/models/org--a/main",
)


def landed_db(path: Path) -> None:
    """A database written by the landed version: one active deployment that serves."""
    db = sqlite3.connect(path)
    db.executescript(LANDED)
    db.execute(
        "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at, ended_at)"
        " VALUES ('box', 1, ?, 'cli:root', 'active', 100.0, 175.0)",
        (json.dumps(SPEC.to_dict()),),
    )
    db.executemany(
        "INSERT INTO transitions VALUES (1, ?, ?)", [("planned", 100.0), ("starting", 110.0), ("active", 175.0)]
    )
    db.execute("INSERT INTO serving VALUES ('box', 1)")
    db.commit()
    db.close()


def history_cli(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[hosts.box]\ngpus = 1\n[models.a]\nrepo = "org/a"\ngpus = [0]\n'
    )
    return run("history", "--local", "--json", "--config", str(cfg), cwd=REPO)


def test_landed_database_is_migrated_and_keeps_its_history(tmp_path: Path) -> None:
    """An unversioned database of the landed schema is migrated to the current version and reads as before."""
    path = tmp_path / "state.db"
    landed_db(path)
    store = SqliteStore(path, group=None)
    serving = store.serving("box")
    assert serving is not None and serving.phase is Phase.ACTIVE and serving.spec == SPEC
    assert [t.phase for t in serving.timings] == ["planned", "starting"]
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert {"config_revisions", "deployment_configs"} <= {
        r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
    }


def test_version_1_database_gains_the_config_tables(tmp_path: Path) -> None:
    """A file at version 1 (before `config push` and `tune`) is migrated to the current version, history intact."""
    path = tmp_path / "state.db"
    landed_db(path)
    SqliteStore(path, group=None).close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE config_revisions")
    db.execute("DROP TABLE deployment_configs")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = SqliteStore(path, group=None)
    assert store.serving("box") is not None
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_older_rows_gain_restores_and_fallback_from_the_rules_of_their_time(tmp_path: Path) -> None:
    """Migrating to version 5: a "rollback...:to-N" trigger becomes restores = N; the fallback is
    the previous revision unless there was none or --no-rollback was given."""
    path = tmp_path / "state.db"
    landed_db(path)
    db = sqlite3.connect(path)
    db.executemany(
        "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at, previous_revision,"
        " no_rollback) VALUES ('box', ?, ?, ?, 'active', 200.0, ?, ?)",
        [
            (2, json.dumps(SPEC.to_dict()), "rollback by watch:to-1", 1, 0),
            (3, json.dumps(SPEC.to_dict()), "cli:root", 2, 1),
        ],
    )
    db.commit()
    db.close()
    store = SqliteStore(path, group=None)
    got = [(d.restores, d.fallback.value) for d in (store.by_revision("box", r) for r in (1, 2, 3))]
    store.close()
    assert got == [(None, "none"), (1, "previous"), (None, "none")]


def test_fresh_database_is_stamped_with_the_current_version(tmp_path: Path) -> None:
    """A new file gets the schema and PRAGMA user_version = the current version."""
    SqliteStore(tmp_path / "state.db", group=None).close()
    assert sqlite3.connect(tmp_path / "state.db").execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_newer_database_is_refused_naming_file_and_versions(tmp_path: Path) -> None:
    """A file from a newer orchestrator is refused with its version and the supported one; the CLI exits 2."""
    path = tmp_path / "state" / "state.db"
    path.parent.mkdir()
    landed_db(path)
    sqlite3.connect(path).execute("PRAGMA user_version = 7")
    with pytest.raises(
        StateStoreError,
        match=rf"{path}: schema version 7 is newer than this orchestrator "
        rf"supports \({SCHEMA_VERSION}\)",
    ):
        SqliteStore(path, group=None)
    result = history_cli(tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: state store {path}: schema version 7 is newer than this orchestrator "
        f"supports ({SCHEMA_VERSION}); upgrade orchestrator (or move the file aside)\n"
    )


def test_garbage_file_is_a_clean_error(tmp_path: Path) -> None:
    """A file that is not a database gives one line naming it, exit 2, no traceback."""
    path = tmp_path / "state" / "state.db"
    path.parent.mkdir()
    path.write_bytes(b"this is not a database, just some text that is long enough\n" * 20)
    result = history_cli(tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: state store {path}: not an SQLite database")
    assert result.stderr.count("\n") == 1


def test_database_of_another_program_is_refused(tmp_path: Path) -> None:
    """An unversioned file with foreign tables is not adopted: the error names its tables."""
    path = tmp_path / "state.db"
    sqlite3.connect(path).execute("CREATE TABLE photos (id INTEGER)")
    with pytest.raises(StateStoreError, match=r"holds tables that are not orchestrator's \(photos\)"):
        SqliteStore(path, group=None)


def test_rows_with_extra_columns_and_nulls_do_not_crash_history(tmp_path: Path) -> None:
    """Unknown columns are ignored and NULL or garbage optional values are tolerated by history."""
    path = tmp_path / "state" / "state.db"
    path.parent.mkdir()
    landed_db(path)
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE deployments ADD COLUMN added_later TEXT")
    db.execute(
        "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at, bench, added_later)"
        " VALUES ('box', 2, ?, 'cli:root', 'failed', 200.0, 'not json', 'x')",
        (json.dumps({**SPEC.to_dict(), "field_from_the_future": 1}),),
    )
    db.execute("INSERT INTO transitions VALUES (2, 'planned', 200.0)")
    db.commit()
    db.close()
    result = history_cli(tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["revision"], r["outcome"], r["ended_at"]) for r in rows] == [(2, "failed", None), (1, "active", 175.0)]


def test_row_with_an_unknown_phase_is_a_clean_error(tmp_path: Path) -> None:
    """A phase this version does not know names the deployment and the value instead of a traceback."""
    path = tmp_path / "state" / "state.db"
    path.parent.mkdir()
    landed_db(path)
    db = sqlite3.connect(path)
    db.execute("UPDATE deployments SET phase='teleporting' WHERE id=1")
    db.commit()
    db.close()
    result = history_cli(tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: state store {path}: deployment #1: unknown phase 'teleporting' "
        f"(written by another version of orchestrator?)\n"
    )


def test_state_directory_and_database_are_not_world_readable(tmp_path: Path) -> None:
    """Existing 0755/0644 modes are tightened: directory 0700 without a socket group, database 0600."""
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    landed_db(state / "state.db")
    (state / "state.db").chmod(0o644)
    SqliteStore(state / "state.db", group=None).close()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / "state.db").stat().st_mode) == 0o600


def test_state_directory_is_group_readable_for_the_socket_group(tmp_path: Path) -> None:
    """With an existing socket group the directory is 0750 and owned by it, the database still 0600."""
    SqliteStore(tmp_path / "state" / "state.db", group="root").close()
    st = (tmp_path / "state").stat()
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o750, 0)
    assert stat.S_IMODE((tmp_path / "state" / "state.db").stat().st_mode) == 0o600


def test_shared_directory_is_refused_as_state_dir(tmp_path: Path) -> None:
    """A world-writable directory (such as /tmp) is never chmod-ed into a state directory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(StateStoreError, match="is a shared directory"):
        SqliteStore(shared / "state.db", group=None)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
