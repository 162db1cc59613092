"""Benchmark plans validate their values; results compute vLLM-comparable figures and round-trip JSON."""

from __future__ import annotations

import json

import pytest

from orchestrator.errors import UsageError
from orchestrator.loadgen import BenchPlan, BenchResult, BenchTarget, LevelResult
from orchestrator.loadgen.sse import RequestOutcome


def ok(start: float, ttft: float, latency: float, tokens: int, end: float | None = None) -> RequestOutcome:
    gaps = tuple((latency - ttft) / (tokens - 1) for _ in range(tokens - 1)) if tokens > 1 else ()
    return RequestOutcome(
        ok=True,
        start=start,
        end=end or start + latency,
        ttft=ttft,
        latency=latency,
        itl=gaps,
        prompt_tokens=10,
        completion_tokens=tokens,
    )


def test_plan_refuses_both_duration_and_requests() -> None:
    """--duration and --requests exclude each other."""
    with pytest.raises(UsageError, match="not both"):
        BenchPlan(duration_s=10, requests=5)


def test_plan_refuses_a_zero_concurrency_level() -> None:
    """Every concurrency level must be at least 1; the message names the levels."""
    with pytest.raises(UsageError, match=r"\(1, 0\)"):
        BenchPlan(concurrency=(1, 0))


def test_plan_without_duration_or_requests_runs_30_seconds() -> None:
    """Neither given means 30 s per level."""
    assert BenchPlan().effective_duration_s == 30.0


def test_target_refuses_a_url_without_scheme() -> None:
    """The base URL must be http(s); the message names it."""
    with pytest.raises(UsageError, match="127.0.0.2:8000"):
        BenchTarget("127.0.0.2:8000")


def test_output_throughput_is_usage_tokens_over_level_duration() -> None:
    """Two requests of 100 tokens in a 4 s level give 50 output tok/s and 0.5 req/s."""
    lv = LevelResult.from_outcomes(2, [ok(0, 0.1, 2.0, 100), ok(0, 0.2, 4.0, 100)], duration_s=4.0)
    assert (lv.output_tokens, lv.output_tok_s, lv.requests_per_s) == (200, 50.0, 0.5)


def test_per_stream_rate_is_tokens_over_summed_latency() -> None:
    """200 tokens over 2 s + 4 s of request latency give 33.3 tok/s per stream; the median request 37.5."""
    lv = LevelResult.from_outcomes(2, [ok(0, 0.1, 2.0, 100), ok(0, 0.2, 4.0, 100)], duration_s=4.0)
    assert (lv.output_tok_s_per_stream, lv.stream_tok_s.p50) == pytest.approx((200 / 6, 37.5))


def test_tpot_excludes_the_first_token() -> None:
    """TPOT = (latency - TTFT) / (tokens - 1): 1 s after a 0.1 s TTFT over 11 tokens is 90 ms."""
    lv = LevelResult.from_outcomes(1, [ok(0, 0.1, 1.0, 11)], duration_s=1.0)
    assert lv.tpot_ms.p50 == pytest.approx(90.0)


def test_failures_are_counted_by_kind_with_an_example() -> None:
    """Failed requests do not add tokens; each kind is counted and keeps its first message."""
    fails = [
        RequestOutcome.failure(0, 1, "http_500", "boom"),
        RequestOutcome.failure(0, 1, "http_500", "b2"),
        RequestOutcome.failure(0, 1, "connect", "refused"),
    ]
    lv = LevelResult.from_outcomes(1, [ok(0, 0.1, 1.0, 10), *fails], duration_s=1.0)
    assert ({e.kind: (e.count, e.example) for e in lv.errors}, lv.output_tokens) == (
        {"connect": (1, "refused"), "http_500": (2, "boom")},
        10,
    )


def test_result_round_trips_through_json() -> None:
    """to_dict gives plain JSON and from_dict rebuilds an equal result."""
    fail = RequestOutcome.failure(0, 1, "timeout", "t")
    lv = LevelResult.from_outcomes(1, [ok(0, 0.1, 1.0, 10), fail], 1.0)
    result = BenchResult(
        base_url="http://127.0.0.2:8000",
        model="m",
        endpoint="completions",
        plan=BenchPlan(concurrency=(1,), requests=2),
        started_at="2026-11-29T18:00:00+00:00",
        complete=True,
        levels=(lv,),
    )
    assert BenchResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_headline_figures_read_the_levels() -> None:
    """single_stream_tok_s is C=1's per-stream rate; peak_output_tok_s the best aggregate."""
    levels = (
        LevelResult.from_outcomes(1, [ok(0, 0.1, 2.0, 100)], 2.0),
        LevelResult.from_outcomes(4, [ok(0, 0.1, 2.0, 100)] * 4, 2.0),
    )
    result = BenchResult(
        base_url="http://h", model="m", endpoint="chat", plan=BenchPlan(), started_at="", complete=True, levels=levels
    )
    assert (result.single_stream_tok_s, result.peak_output_tok_s) == (50.0, 200.0)
