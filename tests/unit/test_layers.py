"""The layer contracts of pyproject.toml ([tool.importlinter]) hold for the tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_imports_keep_the_layers_and_make_no_circle() -> None:
    """`lint-imports` keeps every contract: no import runs up a layer, no circle, core does no I/O."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "lint-imports is missing: run scripts/setup.sh (the test extra installs import-linter)"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
