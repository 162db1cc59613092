"""The state store: one SQLite file (WAL) under the state dir.

Every phase change is committed before the engine runs the next step, so a crash leaves a record
that says exactly which step was in flight.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.core.records import Deployment, PhaseTiming, UnitSpec
from orchestrator.core.states import TERMINAL, Phase
from orchestrator.errors import StateError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
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
);
CREATE TABLE IF NOT EXISTS transitions (
  deployment_id INTEGER NOT NULL REFERENCES deployments(id),
  phase TEXT NOT NULL,
  at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS serving (
  host TEXT PRIMARY KEY,
  revision INTEGER
);
-- With the front proxy a host serves a set of models (one row each); the plan of each switch in it
-- (mode, the set before, what it displaced) is what a rollback restores.
CREATE TABLE IF NOT EXISTS serving_models (
  host TEXT NOT NULL,
  revision INTEGER NOT NULL,
  PRIMARY KEY (host, revision)
);
CREATE TABLE IF NOT EXISTS deployment_plans (
  deployment_id INTEGER PRIMARY KEY REFERENCES deployments(id),
  plan TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
  at REAL NOT NULL,
  host TEXT,
  kind TEXT NOT NULL,
  detail TEXT NOT NULL
);
"""


class SqliteStore:
    """StateStore over sqlite3; safe to open from several processes (WAL, busy timeout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        # One connection shared by the agent's threads: every use goes through this lock.
        self._lock = threading.RLock()
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise StateError(f"state store {self.path}: {exc}") from exc

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StateError(f"state store {self.path}: {exc}") from exc
            finally:
                if self._db.in_transaction:  # anything that kept us from COMMIT undoes the whole write
                    self._db.execute("ROLLBACK")

    def _read(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(query, args).fetchall()
            except sqlite3.Error as exc:
                raise StateError(f"state store {self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()

    # -- writes ---------------------------------------------------------------------------------
    def create(self, host: str, spec: UnitSpec, trigger: str, previous_revision: int | None,
               at: float, no_rollback: bool = False) -> Deployment:
        with self._tx() as db:
            (last,) = db.execute("SELECT COALESCE(MAX(revision), 0) FROM deployments WHERE host=?",
                                 (host,)).fetchone()
            cur = db.execute(
                "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at,"
                " previous_revision, no_rollback) VALUES (?,?,?,?,?,?,?,?)",
                (host, last + 1, json.dumps(spec.to_dict()), trigger, Phase.PLANNED.value, at,
                 previous_revision, int(no_rollback)))
            dep_id = int(cur.lastrowid or 0)
            db.execute("INSERT INTO transitions VALUES (?,?,?)", (dep_id, Phase.PLANNED.value, at))
        return self.get(dep_id)

    def transition(self, dep_id: int, phase: Phase, at: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE deployments SET phase=?, ended_at=? WHERE id=?",
                       (phase.value, at if phase in TERMINAL else None, dep_id))
            db.execute("INSERT INTO transitions VALUES (?,?,?)", (dep_id, phase.value, at))

    def record_error(self, dep_id: int, *, error: str | None = None,
                     rollback_error: str | None = None) -> None:
        with self._tx() as db:
            if error is not None:
                db.execute("UPDATE deployments SET error=? WHERE id=?", (error, dep_id))
            if rollback_error is not None:
                db.execute("UPDATE deployments SET rollback_error=? WHERE id=?", (rollback_error, dep_id))

    def update_spec(self, dep_id: int, spec: UnitSpec) -> None:
        """Staging resolved the revision: the unit to install changes before anything is stopped."""
        with self._tx() as db:
            db.execute("UPDATE deployments SET spec=? WHERE id=?", (json.dumps(spec.to_dict()), dep_id))

    def set_serving(self, host: str, revision: int | None) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO serving VALUES (?, ?) ON CONFLICT(host) DO UPDATE SET revision=?",
                       (host, revision, revision))

    def set_serving_set(self, host: str, revisions: list[int]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM serving_models WHERE host=?", (host,))
            db.executemany("INSERT INTO serving_models VALUES (?, ?)", [(host, r) for r in sorted(set(revisions))])

    def record_plan(self, dep_id: int, plan: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO deployment_plans VALUES (?, ?) ON CONFLICT(deployment_id) DO UPDATE "
                       "SET plan=excluded.plan", (dep_id, json.dumps(plan)))

    def record_bench(self, dep_id: int, result: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("UPDATE deployments SET bench=? WHERE id=?", (json.dumps(result), dep_id))

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO events VALUES (?,?,?,?)", (at, host, kind, json.dumps(detail)))

    # -- reads ----------------------------------------------------------------------------------
    def get(self, dep_id: int) -> Deployment:
        rows = self._read("SELECT * FROM deployments WHERE id=?", (dep_id,))
        row = rows[0] if rows else None
        if row is None:
            raise StateError(f"deployment #{dep_id} does not exist in {self.path}")
        return self._deployment(row)

    def by_revision(self, host: str, revision: int) -> Deployment:
        rows = self._read("SELECT * FROM deployments WHERE host=? AND revision=?", (host, revision))
        row = rows[0] if rows else None
        if row is None:
            raise StateError(f"host {host} has no revision {revision}")
        return self._deployment(row)

    def history(self, host: str | None = None, limit: int = 50) -> list[Deployment]:
        q = "SELECT * FROM deployments" + (" WHERE host=?" if host else "") + " ORDER BY id DESC LIMIT ?"
        args: tuple[Any, ...] = (host, limit) if host else (limit,)
        return [self._deployment(r) for r in self._read(q, args)]

    def unfinished(self, host: str | None = None) -> list[Deployment]:
        terminal = tuple(p.value for p in TERMINAL)
        q = (f"SELECT * FROM deployments WHERE phase NOT IN ({','.join('?' * len(terminal))})"
             + (" AND host=?" if host else "") + " ORDER BY id")
        return [self._deployment(r) for r in self._read(q, (*terminal, *((host,) if host else ())))]

    def serving(self, host: str) -> Deployment | None:
        rows = self._read("SELECT revision FROM serving WHERE host=?", (host,))
        row = rows[0] if rows else None
        if row is None or row[0] is None:
            return None
        return self.by_revision(host, int(row[0]))

    def serving_set(self, host: str) -> list[Deployment]:
        rows = self._read("SELECT revision FROM serving_models WHERE host=? ORDER BY revision", (host,))
        return [self.by_revision(host, int(r[0])) for r in rows]

    def plan_of(self, dep_id: int) -> dict[str, Any] | None:
        rows = self._read("SELECT plan FROM deployment_plans WHERE deployment_id=?", (dep_id,))
        return json.loads(rows[0][0]) if rows else None

    def events(self, host: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        q, args = "SELECT at, host, kind, detail FROM events WHERE 1=1", list[Any]()
        if host:
            q, args = q + " AND host=?", [*args, host]
        if kind:
            q, args = q + " AND kind=?", [*args, kind]
        rows = self._read(q + " ORDER BY rowid DESC LIMIT ?", (*args, limit))
        return [{"at": r[0], "host": r[1], "kind": r[2], **json.loads(r[3])} for r in rows]

    def _deployment(self, row: sqlite3.Row | tuple[Any, ...]) -> Deployment:
        (dep_id, host, revision, spec, trigger, phase, created, prev, ended, error, rb_error,
         no_rb, bench) = row
        marks = self._read("SELECT phase, at FROM transitions WHERE deployment_id=? ORDER BY rowid", (dep_id,))
        timings = tuple(PhaseTiming(p, at, marks[i + 1][1] if i + 1 < len(marks) else None)
                        for i, (p, at) in enumerate(marks) if p not in {t.value for t in TERMINAL})
        return Deployment(id=dep_id, host=host, revision=revision, spec=UnitSpec.from_dict(json.loads(spec)),
                          trigger=trigger, phase=Phase(phase), created_at=created, previous_revision=prev,
                          ended_at=ended, error=error, rollback_error=rb_error, no_rollback=bool(no_rb),
                          timings=timings, bench=json.loads(bench) if bench else None)
