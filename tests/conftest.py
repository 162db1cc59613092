"""Shared fixtures; the host harness lives in tests/hosts (see tests/hosts/fixtures.py)."""

from __future__ import annotations

import sys
from pathlib import Path

# `tests.hosts` is imported as a package from the repo root, however pytest was started.
_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from tests.hosts.fixtures import adapters, host, host_set, hosts  # noqa: F401
