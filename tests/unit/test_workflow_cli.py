"""What a team's workflow ran into on the CLI: the commands as the README and docs/ show them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on the shipped deploy.toml, with its state in tmp_path."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "80"}
    env.pop("ORCHESTRATOR_HOST", None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args, "--config", str(REPO / "deploy.toml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )


def test_tune_resume_with_the_model_and_yes_looks_for_that_models_run(tmp_path: Path) -> None:
    """`tune MODEL --resume --yes` resumes MODEL's run (here: says its host has none), not a usage refusal."""
    result = cli(tmp_path, "tune", "minimax-m25", "--resume", "--yes")
    assert result.returncode == 2
    assert "has no unfinished tune run to resume" in result.stderr, result.stderr


def test_status_through_a_pipe_keeps_each_line_whole(capsys: pytest.CaptureFixture[str]) -> None:
    """A serving line longer than 80 columns stays one line through a pipe: grep 'not healthy' finds it."""
    from orchestrator.cli.deploy_cmds import print_status
    from orchestrator.cli.tables import stdout_console

    url = "http://gpu-box-with-a-long-name.example.internal:8101"
    result = {
        "hosts": {
            "gpu-box-with-a-long-name": {
                "serving": {
                    "model": "minimax-m25-ep",
                    "revision": 10,
                    "unit": "vllm-minimax-m25-ep.service",
                    "url": url,
                    "healthy": False,
                },
                "running": [],
            }
        }
    }
    print_status(stdout_console(), result)
    [line] = [x for x in capsys.readouterr().out.splitlines() if "not healthy" in x]
    assert line.startswith("gpu-box-with-a-long-name: minimax-m25-ep (revision 10") and url in line


def test_tune_table_through_a_pipe_is_plain_columns_one_row_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Through a pipe the tune table has no box and each candidate's row is one whole line."""
    from orchestrator.cli.tune_cmd import _print

    level = {"tok_s": 4012.5, "ttft_p90_ms": 812.0, "errors": 0}
    report = {
        "run": 7,
        "model": "minimax-m25",
        "host": "gpu-box-with-a-long-name",
        "concurrency": [1, 64, 256],
        "decision": {
            "objective": "throughput@256",
            "unit": "tok/s at C=256",
            "winner": "tp8+ep",
            "runner_up": None,
            "margin_pct": None,
            "noise_pct": None,
            "note": "",
        },
        "candidates": [
            {
                "layout": "tp8+ep",
                "status": "ok",
                "winner": True,
                "score": 4012.5,
                "error": None,
                "levels": {"1": level, "64": level, "256": level},
            }
        ],
        "serving": {"model": "minimax-m25.tp8-ep", "revision": 12},
        "diff": None,
    }
    _print(report, False, False, None)
    out = capsys.readouterr().out
    assert "│" not in out and "┃" not in out
    [row] = [x for x in out.splitlines() if x.startswith("*")]
    assert row.split() == [
        "*",
        "tp8+ep",
        "ok",
        "4,012,",
        "812",
        "ms",
        "4,012,",
        "812",
        "ms",
        "4,012,",
        "812",
        "ms",
        "0",
        "4,012.5",
    ]


def test_gpu_memory_reads_with_one_decimal() -> None:
    """A probed 95.5928 GiB GPU reads 95.6 GiB (a whole 96 stays 96) in plan and preflight messages."""
    from orchestrator.core.planner import Hardware

    assert (str(Hardware(8, 95.5928)), str(Hardware(8, 96.0))) == ("8 x 95.6 GiB", "8 x 96 GiB")


def test_readme_first_plan_example_works_without_the_hub(tmp_path: Path) -> None:
    """`orchestrator plan minimax-m25-ep` in the checkout, with an empty cache and no hub: the shipped
    deploy.toml's `config` (shipped:) gives the planner MiniMax-M2.5's config.json."""
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state"),
    }
    env.pop("ORCHESTRATOR_CONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", "minimax-m25-ep"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "orchestrator/configs/MiniMaxAI__MiniMax-M2.5.json" in result.stdout
    assert not (tmp_path / "cache").exists()


def test_the_shipped_deploy_toml_loads_wherever_it_is_copied(tmp_path: Path) -> None:
    """Copied away from the checkout (a box's /etc, `agent install --config`, `config push`), the shipped
    deploy.toml still loads: its `shipped:` configs come from the package, not from next to the file."""
    copy = tmp_path / "elsewhere" / "deploy.toml"
    copy.parent.mkdir()
    copy.write_text((REPO / "deploy.toml").read_text())
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "models", "--config", str(copy)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_an_unknown_shipped_config_is_refused_naming_the_ones_shipped(tmp_path: Path) -> None:
    """`config = "shipped:../x.json"` is refused (exit 2) naming the key and every shipped file."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        (REPO / "deploy.toml")
        .read_text()
        .replace('config = "shipped:MiniMaxAI__MiniMax-M2.5.json"', 'config = "shipped:../x.json"', 1)
    )
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "models", "--config", str(cfg)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert "models.minimax-m25.config" in result.stderr and "MiniMaxAI__MiniMax-M2.5.json" in result.stderr
    assert "no such shipped config.json" in result.stderr


def test_a_rollback_result_names_the_revision_it_redeploys(capsys: pytest.CaptureFixture[str]) -> None:
    """Rolling back to revision 10 makes revision 11: the line names both, not 11 alone for 10's model."""
    from orchestrator.cli.deploy_cmds import _finish

    _finish({"revision": 11, "model": "alpha", "host": "h1", "outcome": "active", "trigger": "rollback:to-10"}, False)
    assert capsys.readouterr().out == "revision 11 (alpha, the unit of revision 10) on h1: active\n"
