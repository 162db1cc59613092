"""The weight store's cleanup after a switch: no worker start where there is nothing to clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.errors import WeightsError


def test_cleanup_without_a_models_directory_starts_no_worker(tmp_path: Path) -> None:
    """A host with no models directory has no revision to remove: cleanup answers none, no worker runs."""
    store = HfWeightStore(LocalShell(), python="/bin/false")  # a worker start would fail the call
    assert store.cleanup(str(tmp_path / "models"), keep=2, protected=set()) == []


def test_cleanup_of_an_existing_models_directory_runs_the_worker(tmp_path: Path) -> None:
    """Where the models directory exists the worker still does the cleanup (here: one that fails)."""
    (tmp_path / "models").mkdir()
    store = HfWeightStore(LocalShell(), python="/bin/false")
    with pytest.raises(WeightsError, match="the stage worker exited 1"):
        store.cleanup(str(tmp_path / "models"), keep=2, protected=set())
