"""The ConfigStore port: one set of assertions for the SQLite store and the in-memory fake."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.adapters.config_store import SqliteConfigStore
from orchestrator.agent.config_ops import ConfigRevisions
from orchestrator.ports import ConfigStore
from orchestrator.testing import FakeConfigStore


@pytest.fixture(params=["sqlite", "fake"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConfigStore]:
    if request.param == "fake":
        yield FakeConfigStore()
        return
    real = SqliteConfigStore(tmp_path / "state.db", group=None)
    yield real
    real.close()


def test_same_content_is_recorded_once(store: ConfigStore) -> None:
    """Recording the newest revision's content again returns its revision; new content gets the next."""
    assert store.latest() is None
    first = store.record_if_new(1.0, "aa", "op", "a = 1")
    assert store.record_if_new(2.0, "aa", "op", "a = 1") == first
    second = store.record_if_new(3.0, "bb", "op", "a = 2")
    assert second == first + 1 and store.latest() == (second, "bb")


def test_a_failing_then_records_nothing(store: ConfigStore) -> None:
    """When ``then`` raises, the new revision is not recorded (file and revision go in together)."""
    store.record_if_new(1.0, "aa", "op", "a = 1")

    def fail() -> None:
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.record_if_new(2.0, "bb", "op", "a = 2", then=fail)
    assert store.latest() == (1, "aa")


def test_a_deployment_keeps_its_first_link(store: ConfigStore) -> None:
    """Each deployment links to the config revision it first ran with."""
    store.link(7, 1)
    store.link(7, 2)
    store.link(8, 2)
    assert store.links() == {7: 1, 8: 2}


def test_config_revisions_run_on_the_fake(tmp_path: Path) -> None:
    """ConfigRevisions takes the port: history rows are annotated from the fake's links."""
    config = tmp_path / "deploy.toml"
    config.write_text("a = 1\n")
    revisions = ConfigRevisions(config, str(tmp_path), group=None, store=FakeConfigStore())
    revision = revisions.record_if_new("op")
    revisions.link(5, revision)
    assert revisions.annotate([{"id": 5}, {"id": 6}]) == [
        {"id": 5, "config_revision": revision},
        {"id": 6, "config_revision": None},
    ]
    assert not (tmp_path / "state.db").exists()
