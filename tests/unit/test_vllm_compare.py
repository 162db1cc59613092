"""bench/vllm_compare.py's verdict: the ratio of medians, every run kept, rounds paired by number."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from vllm_compare import parse_levels, round_ratios, summarize  # bench/ is a folder of scripts


def run(tool: str, rnd: int, tok_s: float, api_cpu: float = 8.0, c: int = 256) -> dict[str, Any]:
    return {"tool": tool, "round": rnd, "concurrency": c, "requests": 1024, "output_tok_s": tok_s,
            "cpu_s": {"api_server": api_cpu}, "server": {"generation_tokens": 131072}}


def test_levels_take_rounds_per_level() -> None:
    """C:N:ROUNDS sets a level's rounds; C:N takes --rounds."""
    assert parse_levels("1:16,256:1024:4", 2) == [(1, 16, 2), (256, 1024, 4)]


def test_a_bad_level_names_itself() -> None:
    """A level that is not C:N[:ROUNDS] stops the run, quoting the item."""
    with pytest.raises(SystemExit, match="'256:x'"):
        parse_levels("1:16,256:x", 2)


def test_one_stalled_run_does_not_decide_the_verdict() -> None:
    """The verdict is the ratio of medians: one run 20% low moves the mean, not the median."""
    runs = [run("ours", 1, 12500), run("vllm", 1, 12480), run("ours", 2, 12600), run("vllm", 2, 9900, 11.4),
            run("ours", 3, 12550), run("vllm", 3, 12520)]
    level = summarize(runs, [(256, 1024)], 0.02)["levels"][0]
    assert (level["within"], level["means_within"], level["stalled"]) == (True, False, ["vllm round 2"])


def test_rounds_pair_by_number_when_one_is_missing() -> None:
    """A run cut short leaves its round out of the per-round ratios instead of shifting the pairs."""
    runs = [run("ours", 1, 100), run("vllm", 1, 100), run("ours", 2, 110), run("vllm", 3, 50), run("ours", 3, 55)]
    assert round_ratios(runs) == [1.0, 1.1]
