"""The agent's config revisions in the state store (state.db, schema version 2 of state_schema.py).

Through the state file's own connection discipline (SqliteFile: one locked connection, a schema
check on open, every SQLite failure a StateError naming the file), not a raw connection of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.adapters.state_schema import StateFile


class SqliteConfigStore(StateFile):
    """The config_revisions and deployment_configs tables."""

    def latest(self) -> tuple[int, str] | None:
        """(revision, sha256) of the newest recorded revision, or None."""
        rows = self._read("SELECT revision, sha256 FROM config_revisions ORDER BY revision DESC LIMIT 1")
        return (int(rows[0]["revision"]), str(rows[0]["sha256"])) if rows else None

    def record_if_new(
        self, at: float, sha256: str, operator: str, text: str, then: Callable[[], None] | None = None
    ) -> int:
        """Record ``text`` unless the newest revision has the same content; returns its revision.

        ``then`` runs inside the same transaction, after the insert: when it raises, the revision is
        not recorded either (a pushed file and its revision go in together or not at all)."""
        with self._tx() as db:
            row = db.execute("SELECT revision, sha256 FROM config_revisions ORDER BY revision DESC LIMIT 1").fetchone()
            if row is not None and row["sha256"] == sha256:
                revision = int(row["revision"])
            else:
                cur = db.execute(
                    "INSERT INTO config_revisions (at, sha256, operator, text) VALUES (?,?,?,?)",
                    (at, sha256, operator, text),
                )
                revision = int(cur.lastrowid or 0)
            if then is not None:
                then()
        return revision

    def link(self, deployment_id: int, revision: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO deployment_configs VALUES (?, ?)", (deployment_id, revision))

    def links(self) -> dict[int, int]:
        """deployment id -> the config revision it ran with."""
        return {
            int(r["deployment_id"]): int(r["config_revision"])
            for r in self._read("SELECT deployment_id, config_revision FROM deployment_configs")
        }
