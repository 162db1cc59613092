"""The controller's record of its rollouts: one small SQLite file (WAL) in its state dir.

Which hosts, in which batch, each host's state, the box's deployment id and outcome. Every change
is committed before the controller acts on the next host, so a controller that died is resumed
from here (`orchestrator rollout resume`) and never switches a host twice. The file is opened like
state.db (adapters/sqlite_file.SqliteFile): a schema version, one locked connection, and every
SQLite failure a StateError naming the file.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import Any, TypeVar

from orchestrator.adapters.sqlite_file import Migration, SqliteFile, create_or_adopt
from orchestrator.core.rollout import HostRecord, HostState, Policy, Rollout, RolloutStatus
from orchestrator.errors import StateError, StateStoreError

# Version 1: the schema as first landed (until then the file had no user_version).
_V1 = (
    """
CREATE TABLE IF NOT EXISTS rollouts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model TEXT NOT NULL,
  grp TEXT NOT NULL,
  status TEXT NOT NULL,
  canary INTEGER NOT NULL,
  batch INTEGER NOT NULL,
  max_failures INTEGER NOT NULL,
  rollback_all INTEGER NOT NULL,
  gate TEXT NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL,
  pid INTEGER,
  abort_requested INTEGER NOT NULL DEFAULT 0,
  reason TEXT
)""",
    """
CREATE TABLE IF NOT EXISTS rollout_hosts (
  rollout_id INTEGER NOT NULL REFERENCES rollouts(id),
  host TEXT NOT NULL,
  position INTEGER NOT NULL,
  batch INTEGER NOT NULL,
  state TEXT NOT NULL,
  baseline_id INTEGER,
  deployment_id INTEGER,
  outcome TEXT,
  error TEXT,
  switched_at REAL,
  ended_at REAL,
  PRIMARY KEY (rollout_id, host)
)""",
)


def _to_v1(db: sqlite3.Connection, path: str) -> None:
    create_or_adopt(db, path, "rollout store", "rollouts", _V1)


def _to_v2(db: sqlite3.Connection, path: str) -> None:
    """Who started each rollout, as its controller saw them (the agent's view of the caller)."""
    db.execute("ALTER TABLE rollouts ADD COLUMN started_by TEXT")


_MIGRATIONS: tuple[Migration, ...] = (_to_v1, _to_v2)
ROLLOUT_SCHEMA_VERSION = len(_MIGRATIONS)
_S = TypeVar("_S", HostState, RolloutStatus)


class RolloutStore(SqliteFile):
    """``group``: the socket group, which keeps the state directory 0750 (see state_files.py)."""

    KIND = "rollout store"
    MIGRATIONS = _MIGRATIONS

    # -- writing ------------------------------------------------------------------------------------
    def create(
        self,
        model: str,
        group: str,
        policy: Policy,
        gate: str,
        batches: list[tuple[str, ...]],
        pid: int,
        *,
        started_by: str | None = None,
        at: float | None = None,
    ) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO rollouts (model, grp, status, canary, batch, max_failures, rollback_all, gate, "
                "started_at, pid, started_by) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    model,
                    group,
                    RolloutStatus.RUNNING.value,
                    policy.canary,
                    policy.batch,
                    policy.max_failures,
                    int(policy.rollback_all),
                    gate,
                    time.time() if at is None else at,
                    pid,
                    started_by,
                ),
            )
            rid = int(cur.lastrowid or 0)
            position = 0
            for number, batch in enumerate(batches):
                for host in batch:
                    db.execute(
                        "INSERT INTO rollout_hosts (rollout_id, host, position, batch, state) VALUES (?,?,?,?,?)",
                        (rid, host, position, number, HostState.PENDING.value),
                    )
                    position += 1
        return rid

    def set_host(self, rid: int, host: str, **fields: Any) -> None:
        self.set_hosts(rid, {host: fields})

    def set_hosts(self, rid: int, hosts: Mapping[str, Mapping[str, Any]]) -> None:
        """Many hosts' fields in one transaction (a batch of 1,000 is one commit, not 1,000 fsyncs)."""
        allowed = {"state", "baseline_id", "deployment_id", "outcome", "error", "switched_at", "ended_at"}
        bad = {k for fields in hosts.values() for k in fields} - allowed
        if bad:
            raise StateError(f"rollout store: no host field {min(bad)!r}")
        with self._tx() as db:
            for host, fields in hosts.items():
                values = {k: (v.value if isinstance(v, HostState) else v) for k, v in fields.items()}
                cols = ", ".join(f"{k} = ?" for k in values)
                db.execute(
                    f"UPDATE rollout_hosts SET {cols} WHERE rollout_id = ? AND host = ?", (*values.values(), rid, host)
                )

    def finish(self, rid: int, status: RolloutStatus, reason: str | None, at: float | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE rollouts SET status = ?, reason = ?, ended_at = ? WHERE id = ?",
                (status.value, reason, time.time() if at is None else at, rid),
            )

    def take_over(self, rid: int, pid: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE rollouts SET pid = ? WHERE id = ?", (pid, rid))

    def request_abort(self, rid: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE rollouts SET abort_requested = 1 WHERE id = ?", (rid,))

    # -- reading ------------------------------------------------------------------------------------
    def get(self, rid: int) -> Rollout:
        rows = self._read("SELECT * FROM rollouts WHERE id = ?", (rid,))
        if not rows:
            raise StateError(f"no rollout #{rid} in {self.path}")
        return self._rollout(rows[0])

    def hosts(self, rid: int) -> list[HostRecord]:
        rows = self._read("SELECT * FROM rollout_hosts WHERE rollout_id = ? ORDER BY position", (rid,))
        return [
            HostRecord(
                host=r["host"],
                batch=r["batch"],
                state=self._value(HostState, r["state"], rid),
                baseline_id=r["baseline_id"],
                deployment_id=r["deployment_id"],
                outcome=r["outcome"],
                error=r["error"],
            )
            for r in rows
        ]

    def host_times(self, rid: int) -> dict[str, tuple[float | None, float | None]]:
        rows = self._read("SELECT host, switched_at, ended_at FROM rollout_hosts WHERE rollout_id = ?", (rid,))
        return {r["host"]: (r["switched_at"], r["ended_at"]) for r in rows}

    def unfinished(self) -> list[Rollout]:
        rows = self._read("SELECT * FROM rollouts WHERE status = ? ORDER BY id", (RolloutStatus.RUNNING.value,))
        return [self._rollout(r) for r in rows]

    def latest(self) -> Rollout | None:
        rows = self._read("SELECT * FROM rollouts ORDER BY id DESC LIMIT 1")
        return self._rollout(rows[0]) if rows else None

    def recent(self, limit: int, group: str | None = None) -> list[Rollout]:
        """The newest ``limit`` rollouts (of ``group``, or of every group), newest first."""
        where, params = ("WHERE grp = ? ", (group, limit)) if group is not None else ("", (limit,))
        rows = self._read(f"SELECT * FROM rollouts {where}ORDER BY id DESC LIMIT ?", params)
        return [self._rollout(r) for r in rows]

    def _value(self, kind: type[_S], value: str, rid: int) -> _S:
        try:
            return kind(value)
        except ValueError:
            raise StateStoreError(
                f"{self.KIND} {self.path}: rollout #{rid}: unknown state {value!r} "
                f"(written by another version of orchestrator?)"
            ) from None

    def _rollout(self, row: sqlite3.Row) -> Rollout:
        policy = Policy(
            canary=row["canary"],
            batch=row["batch"],
            max_failures=row["max_failures"],
            rollback_all=bool(row["rollback_all"]),
        )
        return Rollout(
            id=row["id"],
            model=row["model"],
            group=row["grp"],
            status=self._value(RolloutStatus, row["status"], row["id"]),
            policy=policy,
            canary=row["canary"],
            gate=row["gate"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            pid=row["pid"],
            abort_requested=bool(row["abort_requested"]),
            reason=row["reason"],
            started_by=row["started_by"],
        )
