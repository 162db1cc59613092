"""Tune runs in the state store: what a run set out to measure and what each candidate gave.

Its tables live in the same SQLite file as the deployments (schema version 3 of
adapters/state_schema.py, which creates and migrates them). A candidate's row is written once its
measurement is complete, so a resumed run never measures a candidate twice.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from orchestrator.adapters.state_schema import StateFile
from orchestrator.core.tune_records import RUNNING, TuneResult, TuneRun
from orchestrator.errors import StateError


class TuneStore(StateFile):
    """Tune runs and results, in the same state file as the deployments."""

    def create(
        self, host: str, model: str, settings: dict[str, Any], previous_revision: int | None, at: float
    ) -> TuneRun:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO tune_runs (host, model, created_at, settings, previous_revision, state)"
                " VALUES (?,?,?,?,?,?)",
                (host, model, at, json.dumps(settings), previous_revision, RUNNING),
            )
            run_id = int(cur.lastrowid or 0)
        return self.get(run_id)

    def record(self, r: TuneResult) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO tune_results VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    r.run_id,
                    r.candidate,
                    r.layout,
                    r.status,
                    r.deployment_id,
                    r.revision,
                    r.error,
                    r.detail,
                    json.dumps(r.records),
                    r.at,
                ),
            )

    def finish(self, run_id: int, state: str, at: float, result: dict[str, Any] | None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE tune_runs SET state=?, ended_at=?, result=? WHERE id=?",
                (state, at, json.dumps(result) if result is not None else None, run_id),
            )

    def get(self, run_id: int) -> TuneRun:
        rows = self._read("SELECT * FROM tune_runs WHERE id=?", (run_id,))
        if not rows:
            raise StateError(f"tune run #{run_id} does not exist in {self.path}")
        return _run(rows[0])

    def unfinished(self, host: str) -> TuneRun | None:
        rows = self._read("SELECT * FROM tune_runs WHERE host=? AND state=? ORDER BY id DESC LIMIT 1", (host, RUNNING))
        return _run(rows[0]) if rows else None

    def finished(self, host: str, limit: int = 10) -> list[TuneRun]:
        """The host's completed runs with their reports, newest first (the dashboard's tune page)."""
        return [
            _run(r)
            for r in self._read(
                "SELECT * FROM tune_runs WHERE host=? AND state='done' AND result IS NOT NULL ORDER BY id DESC LIMIT ?",
                (host, limit),
            )
        ]

    def results(self, run_id: int) -> list[TuneResult]:
        return [_result(r) for r in self._read("SELECT * FROM tune_results WHERE run_id=? ORDER BY at", (run_id,))]


def _run(row: sqlite3.Row) -> TuneRun:
    return TuneRun(
        row["id"],
        row["host"],
        row["model"],
        row["created_at"],
        json.loads(row["settings"]),
        row["previous_revision"],
        row["state"],
        row["ended_at"],
        json.loads(row["result"]) if row["result"] else None,
    )


def _result(row: sqlite3.Row) -> TuneResult:
    return TuneResult(
        row["run_id"],
        row["candidate"],
        row["layout"],
        row["status"],
        row["deployment_id"],
        row["revision"],
        row["error"],
        row["detail"],
        json.loads(row["records"]),
        row["at"],
    )


def read_feedback(path: str | Path, host: str, model: str) -> tuple[list[TuneResult], TuneRun | None]:
    """What tune recorded for MODEL on HOST (failed layouts, newest first; the latest finished run),
    read without creating or changing anything: `plan` must not write state."""
    try:
        if not Path(path).exists():
            return [], None
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    except PermissionError:  # a state_dir only root (or socket_group) may enter: nothing measured to show
        return [], None
    except sqlite3.Error:
        return [], None
    db.row_factory = sqlite3.Row
    try:
        failed = [
            _result(r)
            for r in db.execute(
                "SELECT r.* FROM tune_results r JOIN tune_runs t ON t.id = r.run_id WHERE t.host=? AND t.model=?"
                " AND r.status='failed' ORDER BY r.at DESC",
                (host, model),
            )
        ]
        rows = db.execute(
            "SELECT * FROM tune_runs WHERE host=? AND model=? AND state!=? AND result IS NOT NULL"
            " ORDER BY id DESC LIMIT 1",
            (host, model, RUNNING),
        ).fetchall()
        return failed, _run(rows[0]) if rows else None
    except sqlite3.Error:  # no tune tables yet, or a file we may not read: nothing measured to show
        return [], None
    finally:
        db.close()
