"""The state store: one SQLite file (WAL) under the state dir.

Every phase change is committed before the engine runs the next step, so a crash leaves a record
that says exactly which step was in flight. The file carries its schema version (``PRAGMA
user_version``): older schemas are migrated on open, a newer one is refused with both versions
named, and rows are read by column name. The directory and the file are not world-readable: the
database keeps every unit's text and every error message.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from orchestrator.adapters.state_files import secure_state_file
from orchestrator.core.records import NO_CHANGE, Deployment, PhaseTiming, ServingChange, UnitSpec
from orchestrator.core.states import TERMINAL, Fallback, Phase, fallback_of
from orchestrator.errors import StateError, StateStoreError

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
_ADDABLE = {"trigger": "TEXT NOT NULL DEFAULT ''", "previous_revision": "INTEGER", "ended_at": "REAL",
            "error": "TEXT", "rollback_error": "TEXT", "no_rollback": "INTEGER NOT NULL DEFAULT 0",
            "bench": "TEXT"}


def create_or_adopt(db: sqlite3.Connection, path: str, kind: str, marker: str, statements: tuple[str, ...]) -> None:
    """Version 1 of an unversioned file: a fresh file gets the schema; one that holds the landed
    ``marker`` table is adopted as it is; a file of someone else's tables is refused."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")} - {"sqlite_sequence"}
    if tables and marker not in tables:
        raise StateStoreError(f"{kind} {path}: holds tables that are not orchestrator's "
                              f"({', '.join(sorted(tables))}); point state_dir at a directory of its own")
    for statement in statements:
        db.execute(statement)


def _to_v1(db: sqlite3.Connection, path: str) -> None:
    create_or_adopt(db, path, "state store", "deployments", _V1)
    columns = {r[1] for r in db.execute("PRAGMA table_info(deployments)")}
    missing = [c for c in _REQUIRED if c not in columns]
    if missing:
        raise StateStoreError(f"state store {path}: table deployments has no column {', '.join(missing)}; "
                              f"it is not a state store this orchestrator can read")
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
    db.execute("UPDATE deployments SET restores = CAST(substr(trigger, instr(trigger, ':to-') + 4) AS INTEGER) "
               "WHERE trigger LIKE 'rollback%' AND instr(trigger, ':to-') > 0")
    db.execute("UPDATE deployments SET fallback = CASE WHEN no_rollback = 0 AND (previous_revision IS NOT NULL "
               "OR id IN (SELECT deployment_id FROM deployment_plans)) THEN ? ELSE ? END",
               (Fallback.PREVIOUS.value, Fallback.NONE.value))


def _create(statements: tuple[str, ...]) -> Callable[[sqlite3.Connection, str], None]:
    def step(db: sqlite3.Connection, path: str) -> None:
        for statement in statements:
            db.execute(statement)

    return step


Migration = Callable[[sqlite3.Connection, str], None]
# _MIGRATIONS[v] brings a file from version v to v + 1.
_MIGRATIONS: tuple[Migration, ...] = (_to_v1, _create(_V2), _create(_V3), _create(_V4), _to_v5)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def _what_failed(exc: sqlite3.DatabaseError, otherwise: str) -> str:
    return "not an SQLite database" if "not a database" in str(exc) else otherwise


def _file_state(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


class SqliteFile:
    """One SQLite file of ours: opened secured and migrated to its current schema, one connection
    guarded by a lock, transactions that roll back whole, every SQLite error a StateError naming the
    file. The stores of each kind of record build on it; a file of another schema (rollouts.db) sets
    ``KIND`` (how messages name it) and ``MIGRATIONS`` (``MIGRATIONS[v]`` brings version v to v + 1)."""

    KIND = "state store"
    MIGRATIONS: tuple[Migration, ...] = _MIGRATIONS

    def __init__(self, path: str | Path, *, group: str | None, reading: bool = False) -> None:
        """Open (creating, securing and migrating as needed) the database at ``path``.

        ``reading``: for a read-only command, which must leave the disk as it found it: no file or
        directory is made and no mode changed; a file that is not there reads as an empty store, one of
        an older schema is migrated in memory, and a write fails (StateError naming the file).

        ``group``: the socket group; when it exists and we are root the directory is 0750 and
        owned by it (so members reach the agent's socket there), else 0700. The file is 0600.
        Required, not defaulted: an opener that left it out reset the directory to 0700 and locked
        the group's members out of agent.sock (issue 29).
        """
        self.path = str(path)
        # One connection shared by the agent's threads: every use goes through this lock.
        self._lock = threading.RLock()
        if reading:
            self._db = self._open_reading()
            return
        if self.path != ":memory:":
            secure_state_file(Path(self.path), group)
        try:
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                       check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateStoreError(f"{self.KIND} {self.path}: cannot open: {exc}") from exc
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateStoreError(f"{self.KIND} {self.path}: {_what_failed(exc, 'cannot be used')} ({exc}); move it aside to start a "
                                  f"fresh history") from exc
        except StateStoreError:
            self._db.close()
            raise

    def _open_reading(self) -> sqlite3.Connection:
        """A read-only connection to the file while a writer has it open (its -wal is there); else a
        copy in memory (SQLite's own read-only open would leave -wal and -shm files beside it), of this
        schema: migrated there when the file is older, empty when there is no file."""
        memory = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        memory.row_factory = sqlite3.Row
        self._db = memory
        if self._readable():
            for live in (os.path.exists(self.path + "-wal"), True):
                disk = self._connect_reading(live)
                self._db = disk
                if live and self._current(disk, memory):
                    return disk
                before = _file_state(self.path)
                self._copy(disk, memory)
                # a writer that began (or checkpointed into the file) during the copy: read it live instead
                if live or (before == _file_state(self.path) and not os.path.exists(self.path + "-wal")):
                    break
            self._db = memory
        try:
            self._migrate()
        except (sqlite3.DatabaseError, StateStoreError):
            memory.close()
            raise
        return memory

    def _connect_reading(self, live: bool) -> sqlite3.Connection:
        """``live``: read-only beside a writer's -wal; else immutable (no -shm is made; with no -wal the
        file holds every commit, the last writer checkpointed)."""
        try:
            disk = sqlite3.connect(f"file:{quote(self.path)}?{'mode=ro' if live else 'immutable=1'}", uri=True,
                                   timeout=30.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateStoreError(f"{self.KIND} {self.path}: cannot open: {exc}") from exc
        disk.row_factory = sqlite3.Row
        return disk

    def _current(self, disk: sqlite3.Connection, memory: sqlite3.Connection) -> bool:
        """Whether the file is of this schema (then it is read as it is, and ``memory`` goes)."""
        try:
            current = self._version() == len(self.MIGRATIONS)
        except sqlite3.DatabaseError as exc:
            disk.close()
            memory.close()
            raise StateStoreError(f"{self.KIND} {self.path}: {_what_failed(exc, 'cannot be read')} ({exc})") from exc
        if current:
            memory.close()
        return current

    def _copy(self, disk: sqlite3.Connection, memory: sqlite3.Connection) -> None:
        try:
            disk.backup(memory)
        except sqlite3.DatabaseError as exc:
            memory.close()
            raise StateStoreError(f"{self.KIND} {self.path}: {_what_failed(exc, 'cannot be read')} ({exc})") from exc
        finally:
            disk.close()

    def _readable(self) -> bool:
        """Whether the file is there to read; one this user may not read is a StateStoreError (the CLI adds
        the rule: root, or through the agent), never an empty store."""
        try:
            os.close(os.open(self.path, os.O_RDONLY | os.O_CLOEXEC))
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise StateStoreError(f"{self.KIND} {self.path}: cannot read it: {exc.strerror}") from exc
        return True

    def _version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        latest = len(self.MIGRATIONS)
        if self._version() == latest:
            return
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then see it done
            try:
                version = self._version()
                if version > latest:
                    raise StateStoreError(
                        f"{self.KIND} {self.path}: schema version {version} is newer than this orchestrator "
                        f"supports ({latest}); upgrade orchestrator (or move the file aside)")
                for step in self.MIGRATIONS[version:]:
                    step(self._db, self.path)
                self._db.execute(f"PRAGMA user_version = {latest}")
                self._db.execute("COMMIT")
            finally:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                yield self._db
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StateError(f"{self.KIND} {self.path}: {exc}") from exc
            finally:
                if self._db.in_transaction:  # anything that kept us from COMMIT undoes the whole write
                    self._db.execute("ROLLBACK")

    def _read(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            try:
                return self._db.execute(query, args).fetchall()
            except sqlite3.Error as exc:
                raise StateError(f"{self.KIND} {self.path}: {exc}") from exc

    def close(self) -> None:
        self._db.close()



class SqliteStore(SqliteFile):
    """StateStore over sqlite3; safe to open from several processes (WAL, busy timeout)."""

    # -- writes ---------------------------------------------------------------------------------
    def create(self, host: str, spec: UnitSpec, trigger: str, previous_revision: int | None,
               at: float, no_rollback: bool = False, *, restores: int | None = None,
               fallback: Fallback | None = None, plan: dict[str, Any] | None = None) -> Deployment:
        if fallback is None:
            fallback = fallback_of(previous_revision=previous_revision, in_set=False, no_rollback=no_rollback)
        with self._tx() as db:
            last = db.execute("SELECT COALESCE(MAX(revision), 0) FROM deployments WHERE host=?",
                              (host,)).fetchone()[0]
            cur = db.execute(
                "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at,"
                " previous_revision, no_rollback, restores, fallback) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (host, last + 1, json.dumps(spec.to_dict()), trigger, Phase.PLANNED.value, at,
                 previous_revision, int(no_rollback), restores, fallback.value))
            dep_id = int(cur.lastrowid or 0)
            db.execute("INSERT INTO transitions (deployment_id, phase, at) VALUES (?,?,?)",
                       (dep_id, Phase.PLANNED.value, at))
            if plan is not None:
                db.execute("INSERT INTO deployment_plans (deployment_id, plan) VALUES (?, ?)", (dep_id, json.dumps(plan)))
        return self.get(dep_id)

    def transition(self, dep_id: int, phase: Phase, at: float, serving: ServingChange = NO_CHANGE) -> None:
        with self._tx() as db:
            db.execute("UPDATE deployments SET phase=?, ended_at=? WHERE id=?",
                       (phase.value, at if phase in TERMINAL else None, dep_id))
            db.execute("INSERT INTO transitions (deployment_id, phase, at) VALUES (?,?,?)", (dep_id, phase.value, at))
            self._write_change(db, serving)

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

    def move_serving(self, change: ServingChange) -> None:
        with self._tx() as db:
            self._write_change(db, change)

    def _write_change(self, db: sqlite3.Connection, change: ServingChange) -> None:
        for host, revisions in change.sets:
            self._write_serving_set(db, host, revisions)
        for host, revision in change.pointers:
            self._write_serving(db, host, revision)

    @staticmethod
    def _write_serving(db: sqlite3.Connection, host: str, revision: int | None) -> None:
        db.execute("INSERT INTO serving (host, revision) VALUES (?, ?) ON CONFLICT(host) DO UPDATE SET revision=?",
                   (host, revision, revision))

    @staticmethod
    def _write_serving_set(db: sqlite3.Connection, host: str, revisions: Iterable[int]) -> None:
        db.execute("DELETE FROM serving_models WHERE host=?", (host,))
        db.executemany("INSERT INTO serving_models (host, revision) VALUES (?, ?)",
                       [(host, r) for r in sorted(set(revisions))])

    def record_plan(self, dep_id: int, plan: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO deployment_plans (deployment_id, plan) VALUES (?, ?) ON CONFLICT(deployment_id) DO UPDATE "
                       "SET plan=excluded.plan", (dep_id, json.dumps(plan)))

    def record_bench(self, dep_id: int, result: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("UPDATE deployments SET bench=? WHERE id=?", (json.dumps(result), dep_id))

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO events (at, host, kind, detail) VALUES (?,?,?,?)",
                       (at, host, kind, json.dumps(detail)))

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
        if row is None or row["revision"] is None:
            return None
        return self.by_revision(host, int(row["revision"]))

    def serving_set(self, host: str) -> list[Deployment]:
        rows = self._read("SELECT revision FROM serving_models WHERE host=? ORDER BY revision", (host,))
        return [self.by_revision(host, int(r["revision"])) for r in rows]

    def plan_of(self, dep_id: int) -> dict[str, Any] | None:
        rows = self._read("SELECT plan FROM deployment_plans WHERE deployment_id=?", (dep_id,))
        return _object(rows[0]["plan"]) if rows else None

    def events(self, host: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        q, args = "SELECT at, host, kind, detail FROM events WHERE 1=1", list[Any]()
        if host:
            q, args = q + " AND host=?", [*args, host]
        if kind:
            q, args = q + " AND kind=?", [*args, kind]
        rows = self._read(q + " ORDER BY rowid DESC LIMIT ?", (*args, limit))
        return [{"at": r["at"], "host": r["host"], "kind": r["kind"], **_object(r["detail"])} for r in rows]

    def _deployment(self, row: sqlite3.Row) -> Deployment:
        """A row read by column name: extra columns are ignored, NULLs in optional ones tolerated."""
        cols = set(row.keys())

        def col(name: str, default: Any = None) -> Any:
            value = row[name] if name in cols else None
            return default if value is None else value

        dep_id = int(row["id"])
        marks = [(m["phase"], m["at"]) for m in self._read(
            "SELECT phase, at FROM transitions WHERE deployment_id=? ORDER BY rowid", (dep_id,))
            if m["phase"] is not None and isinstance(m["at"], (int, float))]
        terminal = {t.value for t in TERMINAL}
        timings = tuple(PhaseTiming(p, at, marks[i + 1][1] if i + 1 < len(marks) else None)
                        for i, (p, at) in enumerate(marks) if p not in terminal)
        try:
            spec = UnitSpec.from_dict(json.loads(col("spec", "")))
        except (ValueError, TypeError, KeyError) as exc:
            raise StateStoreError(f"state store {self.path}: deployment #{dep_id}: column spec is not a unit "
                                  f"spec this orchestrator can read ({type(exc).__name__}: {exc})") from None
        try:
            phase = Phase(col("phase"))
        except ValueError:
            raise StateStoreError(f"state store {self.path}: deployment #{dep_id}: unknown phase "
                                  f"{col('phase')!r} (written by another version of orchestrator?)") from None
        try:
            fallback = Fallback(col("fallback", Fallback.NONE.value))
        except ValueError:
            raise StateStoreError(f"state store {self.path}: deployment #{dep_id}: unknown fallback "
                                  f"{col('fallback')!r} (written by another version of orchestrator?)") from None
        bench = _object(col("bench")) or None
        return Deployment(id=dep_id, host=str(col("host", "?")), revision=int(col("revision", 0)), spec=spec,
                          trigger=str(col("trigger", "")), phase=phase, created_at=float(col("created_at", 0.0)),
                          previous_revision=col("previous_revision"), ended_at=col("ended_at"),
                          error=col("error"), rollback_error=col("rollback_error"),
                          no_rollback=bool(col("no_rollback", 0)), timings=timings, bench=bench,
                          restores=col("restores"), fallback=fallback)


def _object(text: object) -> dict[str, Any]:
    """A JSON object column; anything else (NULL, garbage, another JSON type) is kept as raw text."""
    if text is None:
        return {}
    try:
        value = json.loads(str(text))
    except ValueError:
        return {"raw": str(text)}
    return value if isinstance(value, dict) else {"raw": value}
