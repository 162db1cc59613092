"""The box's deploy.toml as the agent owns it: show, push (validated, atomic, previous kept), revisions.

A pushed file is built into what the agent would load (agent/loadout.py, as at start) before
anything is written; then it replaces the file atomically, the old one stays as <file>.prev, and a
config revision is recorded in the state store. Each deployment is linked to the revision it ran
with (its own table, so the deployments table stays as the engine writes it).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import settings, userfiles
from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.agent.loadout import Loadout, build
from orchestrator.core.catalog import Catalog
from orchestrator.errors import ConfigError, RenderError, StateError


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ConfigRevisions:
    """The config file of one agent and its recorded revisions (in the agent's state.db)."""

    def __init__(self, path: str | Path, state_dir: str, *, group: str | None) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        db_path = Path(state_dir) / "state.db"
        # creates and migrates the schema, config tables included, with the modes Operations gives it
        SqliteStore(db_path, group=group).close()
        try:
            self._db = sqlite3.connect(str(db_path), timeout=30.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateError(f"state store {state_dir}/state.db: {exc}") from exc

    def current(self) -> tuple[int | None, str]:
        """(latest revision number, the file's text now)."""
        text = userfiles.read_text(self.path)
        with self._lock:
            row = self._db.execute("SELECT revision FROM config_revisions ORDER BY revision DESC LIMIT 1").fetchone()
        return (int(row[0]) if row else None), text

    def record_if_new(self, operator: str) -> int:
        """Record the file as it is now unless the latest revision already has this content."""
        text = userfiles.read_text(self.path)
        with self._lock:
            row = self._db.execute("SELECT revision, sha256 FROM config_revisions ORDER BY revision DESC "
                                   "LIMIT 1").fetchone()
            if row and row[1] == sha256(text):
                return int(row[0])
            cur = self._db.execute("INSERT INTO config_revisions (at, sha256, operator, text) VALUES (?,?,?,?)",
                                   (time.time(), sha256(text), operator, text))
            return int(cur.lastrowid or 0)

    def show(self) -> dict[str, Any]:
        revision, text = self.current()
        return {"path": str(self.path), "revision": revision, "sha256": sha256(text), "text": text}

    def validate(self, text: str, name: str, running: Catalog, *, now: float,
                 template: str | None = None) -> Loadout:
        """Build what the agent would load from ``text`` (as at start), on a private copy, before
        anything is written; ConfigError or RenderError (exit 2) names the file."""
        fd, tmp = tempfile.mkstemp(prefix=".push-", suffix=".toml", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            try:
                loaded = build(settings.load(tmp), now, template=template)
            except ConfigError as exc:
                raise ConfigError(str(exc).replace(tmp, name)) from None
            except RenderError as exc:
                raise ConfigError(str(exc), file=name) from None
        finally:
            os.unlink(tmp)
        catalog = loaded.catalog
        if catalog.state_dir != running.state_dir:
            raise ConfigError(f"state_dir {catalog.state_dir!r} differs from the agent's {running.state_dir!r}: "
                              "a push cannot move the state (edit the file and restart the agent)", file=name)
        if catalog.defaults.allow_root and not running.defaults.allow_root:
            raise ConfigError("defaults.allow_root: a push cannot turn on engines as root (edit the file on the box "
                              "as root and restart the agent)", file=name)
        return loaded

    def replace(self, text: str, operator: str) -> int:
        """Atomically put text in place (previous file kept as .prev) and record it as a revision."""
        mode = self.path.stat().st_mode & 0o777
        # Both through an unguessable temporary: a symlink planted at deploy.toml.prev is replaced, not followed.
        userfiles.write_atomic(self.path.with_name(self.path.name + ".prev"), userfiles.read_bytes(self.path), mode=mode)
        userfiles.write_atomic(self.path, text.encode(), mode=mode)
        return self.record_if_new(operator)

    def link(self, deployment_id: int, revision: int) -> None:
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO deployment_configs VALUES (?, ?)", (deployment_id, revision))

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add config_revision to history rows (None for deployments from before revisions were kept)."""
        with self._lock:
            links = dict(self._db.execute("SELECT deployment_id, config_revision FROM deployment_configs").fetchall())
        return [{**r, "config_revision": links.get(r["id"])} for r in rows]
