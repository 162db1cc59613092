"""Read-only commands run in-process (no agent) leave the disk as they found it: no state dir, no
database, no mode changed; one that finds records reads them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from orchestrator.adapters.sqlite_store import SqliteStore
from tests.unit.cli_runner import invoke
from tests.unit.test_store import landed_db

LOCAL = (
    '[proxy]\nenabled = true\nport = 9000\n[hosts.box]\ntransport = "local"\ngpus = 8\n'
    '[models.a]\nrepo = "org/a"\ngpus = [0]\n[groups.g]\nhosts = ["box"]\n'
)
READ_ONLY = [
    ["status"],
    ["status", "--json"],
    ["history"],
    ["schedules"],
    ["switch", "a", "--dry-run"],
    ["compare"],
    ["rollout", "status"],
    ["status", "--group", "g"],
    ["history", "--group", "g"],
    ["render", "--proxy"],
]


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "deploy.toml").write_text(LOCAL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _tree(top: Path) -> dict[str, int]:
    return {str(p.relative_to(top)): os.lstat(p).st_mode for p in [top, *top.rglob("*")]} if top.exists() else {}


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_creates_no_state_dir(box: Path, args: list[str]) -> None:
    """With no state dir yet, a read-only command answers (or refuses) and the state dir still does not exist."""
    invoke(*args)
    assert not box.exists(), sorted(_tree(box))


@pytest.mark.parametrize("args", READ_ONLY, ids=" ".join)
def test_a_read_only_command_changes_nothing_in_an_existing_state_dir(box: Path, args: list[str]) -> None:
    """An existing state dir (a wider mode than the writers set, no rollouts.db) keeps its files and modes."""
    store = SqliteStore(box / "state.db", group=None)
    store.close()
    os.chmod(box, 0o755)
    before = _tree(box)
    invoke(*args)
    assert _tree(box) == before


def test_history_reads_an_older_database_without_migrating_it(box: Path) -> None:
    """`history` shows the deployment of a database of the first schema and leaves the file's bytes as they were."""
    box.mkdir()
    landed_db(box / "state.db")
    data, before = (box / "state.db").read_bytes(), _tree(box)
    result = invoke("history", "--json")
    assert result.exit_code == 0, result.output
    assert [(r["model"], r["outcome"]) for r in json.loads(result.stdout)] == [("a", "active")]
    assert (box / "state.db").read_bytes() == data and _tree(box) == before


def test_history_reads_beside_a_live_writer(box: Path) -> None:
    """A writer holds state.db open (its -wal there, a deployment committed to it only): `history` reads it."""
    from tests.unit.test_store import SPEC

    store = SqliteStore(box / "state.db", group=None)
    try:
        store.create("box", SPEC, "cli:root", None, 100.0)
        assert (box / "state.db-wal").exists()
        result = invoke("history", "--json")
        assert result.exit_code == 0, result.output
        assert [r["model"] for r in json.loads(result.stdout)] == ["a"]
    finally:
        store.close()
