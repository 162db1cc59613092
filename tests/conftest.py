"""Shared fixtures; the host harness lives in tests/hosts (see tests/hosts/fixtures.py)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# `tests.hosts` is imported as a package from the repo root, however pytest was started.
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.hosts.fixtures import (  # noqa: F401
    adapters,
    host,
    host_set,
    hosts,
    inside_adapters,
    netns_fleet,
    netns_pair,
)


@pytest.fixture(scope="session", autouse=True)
def ctrl_c_reaches_the_suite() -> Iterator[None]:
    """A suite started in the background by a shell without job control inherits SIGINT ignored (so
    do the programs it starts): a test that sends SIGINT then waits out its whole run. Python's own
    handler for the session, as in a terminal."""
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A fresh directory outside /tmp: catalog paths (models_dir) must be where a unit with
    PrivateTmp=yes can see them, which pytest's tmp_path is not."""
    path = Path("/var/lib/orchestrator-test/work") / uuid.uuid4().hex[:12]
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 20 MiB tmpfs: a disk that fills up (ENOSPC) on demand."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
