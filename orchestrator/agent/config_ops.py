"""The box's deploy.toml as the agent owns it: show, push (validated, atomic, previous kept), revisions.

A pushed file is built into what the agent would load (agent/loadout.py, as at start) before
anything is written; then, in one state-store transaction, a config revision is recorded and the
file is replaced atomically (the old one stays as <file>.prev): a revision that cannot be recorded
changes no file. Each deployment is linked to the revision it ran with (its own table, so the
deployments table stays as the engine writes it).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator import settings, userfiles
from orchestrator.adapters.config_store import SqliteConfigStore
from orchestrator.agent.loadout import Loadout, build
from orchestrator.core.catalog import Catalog
from orchestrator.errors import ConfigError, RenderError, StateError
from orchestrator.ports import ConfigStore


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class ConfigRevisions:
    """The config file of one agent and its recorded revisions (in the agent's state.db)."""

    def __init__(
        self, path: str | Path, state_dir: str, *, group: str | None, store: ConfigStore | None = None
    ) -> None:
        self.path = Path(path)
        # by default state.db: creates and migrates the schema, config tables included, with the modes
        # Operations gives it
        self._store = store or SqliteConfigStore(Path(state_dir) / "state.db", group=group)

    def current(self) -> tuple[int | None, str]:
        """(latest revision number, the file's text now)."""
        text = userfiles.read_text(self.path)
        latest = self._store.latest()
        return (latest[0] if latest else None), text

    def record_if_new(self, operator: str) -> int:
        """Record the file as it is now unless the latest revision already has this content."""
        text = userfiles.read_text(self.path)
        return self._store.record_if_new(time.time(), sha256(text), operator, text)

    def show(self) -> dict[str, Any]:
        revision, text = self.current()
        return {"path": str(self.path), "revision": revision, "sha256": sha256(text), "text": text}

    def validate(self, text: str, name: str, running: Catalog, *, now: float, template: str | None = None) -> Loadout:
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
            raise ConfigError(
                f"state_dir {catalog.state_dir!r} differs from the agent's {running.state_dir!r}: "
                "a push cannot move the state (edit the file and restart the agent)",
                file=name,
            )
        if catalog.defaults.allow_root and not running.defaults.allow_root:
            raise ConfigError(
                "defaults.allow_root: a push cannot turn on engines as root (edit the file on the box "
                "as root and restart the agent)",
                file=name,
            )
        return loaded

    def replace(self, text: str, operator: str) -> int:
        """Record text as a revision and put it in place (previous file kept as .prev), as one unit:
        the file is swapped inside the revision's transaction, so a refused record changes no file."""
        mode = self.path.stat().st_mode & 0o777
        old = userfiles.read_bytes(self.path)
        prev = self.path.with_name(self.path.name + ".prev")
        swapped = False

        def swap() -> None:
            nonlocal swapped
            # Both through an unguessable temporary: a symlink planted at deploy.toml.prev is replaced, not followed.
            try:
                userfiles.write_atomic(prev, old, mode=mode)
                userfiles.write_atomic(self.path, text.encode(), mode=mode)
            except OSError as exc:
                raise StateError(f"config file {self.path}: cannot replace it: {exc}") from exc
            swapped = True

        try:
            return self._store.record_if_new(time.time(), sha256(text), operator, text, then=swap)
        except StateError:
            if swapped:  # the commit itself failed: the file goes back to what the revisions say
                userfiles.write_atomic(self.path, old, mode=mode)
            raise

    def link(self, deployment_id: int, revision: int) -> None:
        self._store.link(deployment_id, revision)

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Add config_revision to history rows (None for deployments from before revisions were kept)."""
        links = self._store.links()
        return [{**r, "config_revision": links.get(r["id"])} for r in rows]
