"""Numeric options from the review (huge, NaN, infinite, non-ASCII digits): exit 2 naming the option and
the value cut short, before any file or host is read; bench and tune check every argument first."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import Result

from .cli_runner import invoke

HUGE = "9" * 5000
OVER_SQLITE = str(2**63)


def run(*args: str) -> Result:
    return invoke(*args)


def assert_refused(result: Result, option: str) -> None:
    assert result.exit_code == 2, (result.output, result.exception)
    assert option in result.output and "Traceback" not in result.output, result.output
    assert len(result.output) < 2000, result.output[:300]  # the value is quoted cut short


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["rollout", "status", "--id", HUGE], "--id"),
        (["rollout", "status", "--id", OVER_SQLITE], "--id"),
        (["rollout", "resume", "--id", HUGE], "--id"),
        (["rollback", "--to", OVER_SQLITE], "--to"),
        (["rollback", "--to", str(2**31)], "--to"),
        (["history", "--limit", "10001"], "--limit"),
        (["history", "--limit", HUGE], "--limit"),
        (["plan", "--gpu-memory-gib", "nan", "--gpus", "8"], "--gpu-memory-gib"),
        (["plan", "--gpu-memory-gib", "inf", "--gpus", "8"], "--gpu-memory-gib"),
        (["plan", "--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
        (["plan", "--tp", "\u0668"], "--tp"),
        (["plan", "--max-model-len", HUGE], "--max-model-len"),
        (["bench", "--duration", "inf"], "--duration"),
        (["bench", "--duration", "nan"], "--duration"),
        (["bench", "--max-tokens", HUGE], "--max-tokens"),
        (["bench", "--requests", "1_000"], "--requests"),
        (["tune", "m", "--prompt-tokens", HUGE], "--prompt-tokens"),
        (["rollout", "start", "m", "--canary", HUGE], "--canary"),
        (["agent", "--metrics-port", "\u0669\u0660"], "--metrics-port"),
    ],
)
def test_bad_numeric_option_is_refused_naming_it(args: list[str], option: str) -> None:
    """Each numeric option refuses a huge, non-finite or non-ASCII value: exit 2 naming the option."""
    assert_refused(run(*args), option)


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A deploy.toml whose one host is an SSH address where nothing listens: contacting it exits 4."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "deploy.toml").write_text(f"""
state_dir = "{tmp_path / "state"}"
[hosts.box]
transport = "ssh"
address = "127.0.0.1"
ssh_port = {port}
gpus = 2
[models.a]
repo = "org/a"
gpus = [0]
""")
    return tmp_path / "deploy.toml"


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["bench", "--concurrency", HUGE], "--concurrency"),
        (["bench", "--concurrency", "1,0"], "--concurrency"),
        (["bench", "--concurrency", "1,100000"], "--concurrency"),
        (["tune", "a", "--concurrency", HUGE, "--yes"], "--concurrency"),
        (["tune", "a", "--max-num-seqs", HUGE, "--yes"], "--max-num-seqs"),
        (["tune", "a", "--objective", "throughput@" + HUGE, "--yes"], "--objective"),
        (["tune", "a", "--objective", "ttft-p90@64:" + HUGE, "--yes"], "--objective"),
    ],
)
def test_bench_and_tune_check_arguments_before_contacting_the_host(
    unreachable: Path, args: list[str], option: str
) -> None:
    """A bad level list or objective exits 2 naming the option, not 4 from trying the host first."""
    assert_refused(run(*args, "--config", str(unreachable)), option)


def test_tune_refuses_a_layout_wider_than_the_host_before_contacting_it(unreachable: Path) -> None:
    """`tune a --layouts tp16` on a 2-GPU host: exit 2 naming tp16 and the GPU count, not exit 4."""
    result = run("tune", "a", "--layouts", "tp16", "--yes", "--config", str(unreachable))
    assert result.exit_code == 2 and "tp16 needs 16 GPUs, the host has 2" in result.output, result.output
