"""One SQLite file of ours (WAL) under the state dir: opened secured, migrated to its schema's version.

The file carries its schema version (``PRAGMA user_version``): older schemas are migrated on open, a
newer one is refused with both versions named. The directory and the file are not world-readable:
the databases keep every unit's text and every error message. Each file's schema is a module of its
own (state_schema.py for state.db; rollout/store.py, residency_store.py).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from orchestrator.adapters.state_files import secure_state_file
from orchestrator.errors import StateError, StateStoreError

Migration = Callable[[sqlite3.Connection, str], None]


def create_or_adopt(db: sqlite3.Connection, path: str, kind: str, marker: str, statements: tuple[str, ...]) -> None:
    """Version 1 of an unversioned file: a fresh file gets the schema; one that holds the landed
    ``marker`` table is adopted as it is; a file of someone else's tables is refused."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")} - {"sqlite_sequence"}
    if tables and marker not in tables:
        raise StateStoreError(
            f"{kind} {path}: holds tables that are not orchestrator's "
            f"({', '.join(sorted(tables))}); point state_dir at a directory of its own"
        )
    for statement in statements:
        db.execute(statement)


def _what_failed(exc: sqlite3.DatabaseError, otherwise: str) -> str:
    return "not an SQLite database" if "not a database" in str(exc) else otherwise


def _file_state(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


class SqliteFile:
    """One SQLite file of ours: opened secured and migrated to its current schema, one connection
    guarded by a lock, transactions that roll back whole, every SQLite error a StateError naming the
    file. The stores of each kind of record build on it; each file's schema (state_schema.StateFile for
    state.db, rollouts.db, residency.db) sets ``KIND`` (how messages name it) and ``MIGRATIONS``
    (``MIGRATIONS[v]`` brings version v to v + 1)."""

    KIND: ClassVar[str]
    MIGRATIONS: ClassVar[tuple[Migration, ...]]

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
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateStoreError(f"{self.KIND} {self.path}: cannot open: {exc}") from exc
        self._db.row_factory = sqlite3.Row
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StateStoreError(
                f"{self.KIND} {self.path}: {_what_failed(exc, 'cannot be used')} ({exc}); "
                f"move it aside to start a fresh history"
            ) from exc
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
            disk = sqlite3.connect(
                f"file:{quote(self.path)}?{'mode=ro' if live else 'immutable=1'}",
                uri=True,
                timeout=30.0,
                isolation_level=None,
                check_same_thread=False,
            )
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
                        f"supports ({latest}); upgrade orchestrator (or move the file aside)"
                    )
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
