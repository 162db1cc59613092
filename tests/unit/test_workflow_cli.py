"""What a team's workflow ran into on the CLI: the commands as the README shows them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on the shipped deploy.toml, with its state in tmp_path."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80"}
    env.pop("ORCHESTRATOR_HOST", None)
    return subprocess.run([sys.executable, "-m", "orchestrator", *args, "--config", str(REPO / "deploy.toml")],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False)


def test_tune_resume_with_the_model_and_yes_looks_for_that_models_run(tmp_path: Path) -> None:
    """`tune MODEL --resume --yes` resumes MODEL's run (here: says its host has none), not a usage refusal."""
    result = cli(tmp_path, "tune", "minimax-m25", "--resume", "--yes")
    assert result.returncode == 2
    assert "has no unfinished tune run to resume" in result.stderr, result.stderr
