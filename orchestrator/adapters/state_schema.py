"""The schema of state.db and its migrations (``PRAGMA user_version``; SqliteFile runs them on open).

Version 1 is the schema as first landed; each later version adds what a feature needed. Rows are
read by column name, so a column added here never breaks an older reader of the file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from orchestrator.adapters.sqlite_file import Migration, SqliteFile, create_or_adopt
from orchestrator.core.states import Fallback
from orchestrator.errors import StateStoreError

SCHEMA_VERSION = 5

# Version 1: the schema as first landed (until then the file had no user_version).
_V1 = (
    """CREATE TABLE IF NOT EXISTS deployments (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  host TEXT NOT NULL,
  revision INTEGER NOT NULL,
  spec TEXT NOT NULL,
  trigger TEXT NOT NULL,
  phase TEXT NOT NULL,
  created_at REAL NOT NULL,
  previous_revision INTEGER,
  ended_at REAL,
  error TEXT,
  rollback_error TEXT,
  no_rollback INTEGER NOT NULL DEFAULT 0,
  bench TEXT,
  UNIQUE (host, revision)
)""",
    """CREATE TABLE IF NOT EXISTS transitions (
  deployment_id INTEGER NOT NULL REFERENCES deployments(id),
  phase TEXT NOT NULL,
  at REAL NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS serving (
  host TEXT PRIMARY KEY,
  revision INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS events (
  at REAL NOT NULL,
  host TEXT,
  kind TEXT NOT NULL,
  detail TEXT NOT NULL
)""",
)
_TABLES = frozenset({"deployments", "transitions", "serving", "events"})
# Columns of deployments a file without them cannot do without; the others can be added empty.
_REQUIRED = ("id", "host", "revision", "spec", "phase", "created_at")
_ADDABLE = {
    "trigger": "TEXT NOT NULL DEFAULT ''",
    "previous_revision": "INTEGER",
    "ended_at": "REAL",
    "error": "TEXT",
    "rollback_error": "TEXT",
    "no_rollback": "INTEGER NOT NULL DEFAULT 0",
    "bench": "TEXT",
}


def _to_v1(db: sqlite3.Connection, path: str) -> None:
    create_or_adopt(db, path, "state store", "deployments", _V1)
    columns = {r[1] for r in db.execute("PRAGMA table_info(deployments)")}
    missing = [c for c in _REQUIRED if c not in columns]
    if missing:
        raise StateStoreError(
            f"state store {path}: table deployments has no column {', '.join(missing)}; "
            f"it is not a state store this orchestrator can read"
        )
    for column, decl in _ADDABLE.items():
        if column not in columns:
            db.execute(f"ALTER TABLE deployments ADD COLUMN {column} {decl}")


# Version 2: the agent's config revisions (`config push`) and which one each deployment ran with.
_V2 = (
    """CREATE TABLE IF NOT EXISTS config_revisions (
  revision INTEGER PRIMARY KEY AUTOINCREMENT,
  at REAL NOT NULL,
  sha256 TEXT NOT NULL,
  operator TEXT NOT NULL,
  text TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS deployment_configs (
  deployment_id INTEGER PRIMARY KEY,
  config_revision INTEGER NOT NULL REFERENCES config_revisions(revision)
)""",
)


# Version 3: `tune` runs and what each candidate measured.
_V3 = (
    """CREATE TABLE IF NOT EXISTS tune_runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  host TEXT NOT NULL,
  model TEXT NOT NULL,
  created_at REAL NOT NULL,
  settings TEXT NOT NULL,
  previous_revision INTEGER,
  state TEXT NOT NULL,
  ended_at REAL,
  result TEXT
)""",
    """CREATE TABLE IF NOT EXISTS tune_results (
  run_id INTEGER NOT NULL REFERENCES tune_runs(id),
  candidate TEXT NOT NULL,
  layout TEXT NOT NULL,
  status TEXT NOT NULL,
  deployment_id INTEGER,
  revision INTEGER,
  error TEXT,
  detail TEXT,
  records TEXT NOT NULL,
  at REAL NOT NULL,
  PRIMARY KEY (run_id, candidate)
)""",
)


# Version 4: with the front proxy a host serves a set of models (one row each); the plan of each
# switch (mode, the set before, what it displaced) is what a rollback restores.
_V4 = (
    """CREATE TABLE IF NOT EXISTS serving_models (
  host TEXT NOT NULL,
  revision INTEGER NOT NULL,
  PRIMARY KEY (host, revision)
)""",
    """CREATE TABLE IF NOT EXISTS deployment_plans (
  deployment_id INTEGER PRIMARY KEY REFERENCES deployments(id),
  plan TEXT NOT NULL
)""",
)


def _to_v5(db: sqlite3.Connection, path: str) -> None:
    """Version 5: whether a deployment restores a recorded revision, and its fallback, are columns.

    Until now a rollback was known by its trigger's prefix and the fallback worked out on failure;
    old rows get what those rules said then."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(deployments)")}
    if "restores" not in columns:
        db.execute("ALTER TABLE deployments ADD COLUMN restores INTEGER")
    if "fallback" not in columns:
        db.execute(f"ALTER TABLE deployments ADD COLUMN fallback TEXT NOT NULL DEFAULT '{Fallback.NONE.value}'")
    db.execute(
        "UPDATE deployments SET restores = CAST(substr(trigger, instr(trigger, ':to-') + 4) AS INTEGER) "
        "WHERE trigger LIKE 'rollback%' AND instr(trigger, ':to-') > 0"
    )
    db.execute(
        "UPDATE deployments SET fallback = CASE WHEN no_rollback = 0 AND (previous_revision IS NOT NULL "
        "OR id IN (SELECT deployment_id FROM deployment_plans)) THEN ? ELSE ? END",
        (Fallback.PREVIOUS.value, Fallback.NONE.value),
    )


def _create(statements: tuple[str, ...]) -> Callable[[sqlite3.Connection, str], None]:
    def step(db: sqlite3.Connection, path: str) -> None:
        for statement in statements:
            db.execute(statement)

    return step


# MIGRATIONS[v] brings a file from version v to v + 1.
MIGRATIONS: tuple[Migration, ...] = (_to_v1, _create(_V2), _create(_V3), _create(_V4), _to_v5)
assert len(MIGRATIONS) == SCHEMA_VERSION


class StateFile(SqliteFile):
    """state.db: the base of the stores that share it (deployments, config revisions, tune runs)."""

    KIND = "state store"
    MIGRATIONS = MIGRATIONS
