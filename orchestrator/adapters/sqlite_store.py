"""The state store over state.db: deployments and their phases, what each host serves, events.

Every phase change is committed before the engine runs the next step, so a crash leaves a record
that says exactly which step was in flight. The file, its lock and its migrations are SqliteFile's
(sqlite_file.py) and the schema state_schema.py's; rows are read by column name.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

from orchestrator.adapters.state_schema import StateFile
from orchestrator.core.records import NO_CHANGE, Deployment, PhaseTiming, ServingChange, UnitSpec
from orchestrator.core.states import TERMINAL, Fallback, Phase, fallback_of
from orchestrator.errors import StateError, StateStoreError


class SqliteStore(StateFile):
    """StateStore over sqlite3; safe to open from several processes (WAL, busy timeout)."""

    # -- writes ---------------------------------------------------------------------------------
    def create(
        self,
        host: str,
        spec: UnitSpec,
        trigger: str,
        previous_revision: int | None,
        at: float,
        no_rollback: bool = False,
        *,
        restores: int | None = None,
        fallback: Fallback | None = None,
        plan: dict[str, Any] | None = None,
    ) -> Deployment:
        if fallback is None:
            fallback = fallback_of(previous_revision=previous_revision, in_set=False, no_rollback=no_rollback)
        with self._tx() as db:
            last = db.execute("SELECT COALESCE(MAX(revision), 0) FROM deployments WHERE host=?", (host,)).fetchone()[0]
            cur = db.execute(
                "INSERT INTO deployments (host, revision, spec, trigger, phase, created_at,"
                " previous_revision, no_rollback, restores, fallback) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    host,
                    last + 1,
                    json.dumps(spec.to_dict()),
                    trigger,
                    Phase.PLANNED.value,
                    at,
                    previous_revision,
                    int(no_rollback),
                    restores,
                    fallback.value,
                ),
            )
            dep_id = int(cur.lastrowid or 0)
            db.execute(
                "INSERT INTO transitions (deployment_id, phase, at) VALUES (?,?,?)", (dep_id, Phase.PLANNED.value, at)
            )
            if plan is not None:
                db.execute(
                    "INSERT INTO deployment_plans (deployment_id, plan) VALUES (?, ?)", (dep_id, json.dumps(plan))
                )
        return self.get(dep_id)

    def transition(self, dep_id: int, phase: Phase, at: float, serving: ServingChange = NO_CHANGE) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE deployments SET phase=?, ended_at=? WHERE id=?",
                (phase.value, at if phase in TERMINAL else None, dep_id),
            )
            db.execute("INSERT INTO transitions (deployment_id, phase, at) VALUES (?,?,?)", (dep_id, phase.value, at))
            self._write_change(db, serving)

    def record_error(self, dep_id: int, *, error: str | None = None, rollback_error: str | None = None) -> None:
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
        db.execute(
            "INSERT INTO serving (host, revision) VALUES (?, ?) ON CONFLICT(host) DO UPDATE SET revision=?",
            (host, revision, revision),
        )

    @staticmethod
    def _write_serving_set(db: sqlite3.Connection, host: str, revisions: Iterable[int]) -> None:
        db.execute("DELETE FROM serving_models WHERE host=?", (host,))
        db.executemany(
            "INSERT INTO serving_models (host, revision) VALUES (?, ?)", [(host, r) for r in sorted(set(revisions))]
        )

    def record_plan(self, dep_id: int, plan: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO deployment_plans (deployment_id, plan) VALUES (?, ?) "
                "ON CONFLICT(deployment_id) DO UPDATE SET plan=excluded.plan",
                (dep_id, json.dumps(plan)),
            )

    def record_bench(self, dep_id: int, result: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute("UPDATE deployments SET bench=? WHERE id=?", (json.dumps(result), dep_id))

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO events (at, host, kind, detail) VALUES (?,?,?,?)", (at, host, kind, json.dumps(detail))
            )

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
        q = (
            f"SELECT * FROM deployments WHERE phase NOT IN ({','.join('?' * len(terminal))})"
            + (" AND host=?" if host else "")
            + " ORDER BY id"
        )
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
        marks = [
            (m["phase"], m["at"])
            for m in self._read("SELECT phase, at FROM transitions WHERE deployment_id=? ORDER BY rowid", (dep_id,))
            if m["phase"] is not None and isinstance(m["at"], (int, float))
        ]
        terminal = {t.value for t in TERMINAL}
        timings = tuple(
            PhaseTiming(p, at, marks[i + 1][1] if i + 1 < len(marks) else None)
            for i, (p, at) in enumerate(marks)
            if p not in terminal
        )
        try:
            spec = UnitSpec.from_dict(json.loads(col("spec", "")))
        except (ValueError, TypeError, KeyError) as exc:
            raise StateStoreError(
                f"state store {self.path}: deployment #{dep_id}: column spec is not a unit "
                f"spec this orchestrator can read ({type(exc).__name__}: {exc})"
            ) from None
        try:
            phase = Phase(col("phase"))
        except ValueError:
            raise StateStoreError(
                f"state store {self.path}: deployment #{dep_id}: unknown phase "
                f"{col('phase')!r} (written by another version of orchestrator?)"
            ) from None
        try:
            fallback = Fallback(col("fallback", Fallback.NONE.value))
        except ValueError:
            raise StateStoreError(
                f"state store {self.path}: deployment #{dep_id}: unknown fallback "
                f"{col('fallback')!r} (written by another version of orchestrator?)"
            ) from None
        bench = _object(col("bench")) or None
        return Deployment(
            id=dep_id,
            host=str(col("host", "?")),
            revision=int(col("revision", 0)),
            spec=spec,
            trigger=str(col("trigger", "")),
            phase=phase,
            created_at=float(col("created_at", 0.0)),
            previous_revision=col("previous_revision"),
            ended_at=col("ended_at"),
            error=col("error"),
            rollback_error=col("rollback_error"),
            no_rollback=bool(col("no_rollback", 0)),
            timings=timings,
            bench=bench,
            restores=col("restores"),
            fallback=fallback,
        )


def _object(text: object) -> dict[str, Any]:
    """A JSON object column; anything else (NULL, garbage, another JSON type) is kept as raw text."""
    if text is None:
        return {}
    try:
        value = json.loads(str(text))
    except ValueError:
        return {"raw": str(text)}
    return value if isinstance(value, dict) else {"raw": value}
