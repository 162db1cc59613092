"""ResidencyStore in its own SQLite file (residency.db in the state dir), opened as state.db is
(adapters/sqlite_file.SqliteFile: a schema version, one locked connection, errors naming the file).

A file of its own so that the deployment records' schema and this one move independently."""

from __future__ import annotations

import sqlite3

from orchestrator.adapters.sqlite_file import Migration, SqliteFile, create_or_adopt
from orchestrator.core.resident import SERVING, STATES, Residency
from orchestrator.errors import StateError

_V1 = (
    """
CREATE TABLE IF NOT EXISTS residency (
  host TEXT NOT NULL,
  model TEXT NOT NULL,
  state TEXT NOT NULL,
  level TEXT,
  since REAL NOT NULL,
  last_served REAL,
  unit TEXT NOT NULL DEFAULT '',
  weights_gib REAL NOT NULL DEFAULT 0,
  PRIMARY KEY (host, model)
)""",
)


def _to_v1(db: sqlite3.Connection, path: str) -> None:
    create_or_adopt(db, path, "residency store", "residency", _V1)


_MIGRATIONS: tuple[Migration, ...] = (_to_v1,)


class SqliteResidencyStore(SqliteFile):
    KIND = "residency store"
    MIGRATIONS = _MIGRATIONS

    def set_state(
        self,
        host: str,
        model: str,
        state: str,
        at: float,
        *,
        level: str | None = None,
        unit: str = "",
        weights_gib: float | None = None,
    ) -> None:
        if state not in STATES:
            raise StateError(f"residency of {model} on {host}: state {state!r} is not one of {', '.join(STATES)}")
        with self._tx() as db:
            row = db.execute(
                "SELECT state, last_served, weights_gib FROM residency WHERE host = ? AND model = ?", (host, model)
            ).fetchone()
            last = row["last_served"] if row is not None else None
            if weights_gib is None:
                weights_gib = float(row["weights_gib"]) if row is not None else 0.0
            if state == SERVING or (row is not None and row["state"] == SERVING):
                last = at
            db.execute(
                "INSERT OR REPLACE INTO residency (host, model, state, level, since, last_served, unit, "
                "weights_gib) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (host, model, state, level, at, last, unit, weights_gib),
            )

    def residency(self, host: str) -> dict[str, Residency]:
        rows = self._read("SELECT * FROM residency WHERE host = ? ORDER BY model", (host,))
        return {
            r["model"]: Residency(
                host=r["host"],
                model=r["model"],
                state=r["state"],
                since=r["since"],
                level=r["level"],
                last_served=r["last_served"],
                unit=r["unit"],
                weights_gib=r["weights_gib"],
            )
            for r in rows
        }
