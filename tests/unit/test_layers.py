"""The layer contracts of pyproject.toml ([tool.importlinter]) hold for the tree."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from tests.builders.source import parse

ROOT = Path(__file__).resolve().parents[2]


def test_imports_keep_the_layers_and_make_no_circle() -> None:
    """`lint-imports` keeps every contract: no import runs up a layer, no circle, core does no I/O."""
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint is not None, "lint-imports is missing: run scripts/setup.sh (the test extra installs import-linter)"
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_benchmarks_import_no_test_module() -> None:
    """bench/ and scripts/ take shared builders from tests/builders (or tests/hosts), never from a test module."""
    offenders = []
    for path in sorted([*ROOT.glob("bench/**/*.py"), *ROOT.glob("scripts/**/*.py")]):
        for node in ast.walk(parse(path)):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names  # type: ignore[attr-defined]
                if n.startswith(("tests.test_", "tests.unit.test_"))
            ]
    assert offenders == []
