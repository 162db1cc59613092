"""The load generator against the real stand-in server on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from orchestrator.errors import HealthCheckFailed, TransportError
from orchestrator.loadgen import (
    BenchPlan,
    BenchTarget,
    ClientKind,
    LoadGenerator,
    Progress,
    run_bench,
    run_bench_blocking,
)
from tests.standin import StandinServer

Start = Callable[..., StandinServer]


@pytest.fixture(params=["aiohttp", "httpx"])
def client(request: pytest.FixtureRequest) -> ClientKind:
    """Every behaviour holds for both HTTP clients."""
    kind: ClientKind = request.param
    return kind


@pytest.fixture
def standin() -> Iterator[Callable[..., StandinServer]]:
    started: list[StandinServer] = []

    def _start(*args: str) -> StandinServer:
        s = StandinServer("--served-name", "tiny-standin", *args).wait_listening()
        started.append(s)
        return s

    yield _start
    for s in started:
        s.kill()


def test_each_level_runs_its_requests_and_counts_usage_tokens(standin: Start, client: ClientKind) -> None:
    """--requests 6 at C=1 and C=4: six requests of 8 tokens per level, model found via /v1/models."""
    s = standin()
    plan = BenchPlan(concurrency=(1, 4), max_tokens=8, requests=6)
    result = asyncio.run(run_bench(BenchTarget(s.url), plan, client=client))
    levels = [(lv.concurrency, lv.requests_ok, lv.output_tokens, lv.errors) for lv in result.levels]
    assert (result.model, result.client, result.complete, levels) == (
        "tiny-standin",
        client,
        True,
        [(1, 6, 48, ()), (4, 6, 48, ())],
    )


def test_prompts_are_scaled_to_the_requested_prompt_tokens(standin: Start, client: ClientKind) -> None:
    """The warm-up request's usage calibrates prompts: 20 prompt tokens per request as the server counts."""
    s = standin()
    result = asyncio.run(
        run_bench(
            BenchTarget(s.url), BenchPlan(concurrency=(2,), prompt_tokens=20, max_tokens=2, requests=4), client=client
        )
    )
    assert result.levels[0].input_tokens == 4 * 20


def test_prompts_hit_the_prompt_tokens_exactly_when_token_counts_vary_per_word(
    standin: Start, client: ClientKind
) -> None:
    """With a tokenizer whose count per word varies (one token per byte), every prompt is exactly 128 tokens."""
    s = standin("--count-prompt", "bytes")
    plan = BenchPlan(concurrency=(4,), prompt_tokens=128, max_tokens=4, requests=32)
    result = asyncio.run(run_bench(BenchTarget(s.url), plan, client=client))
    assert result.levels[0].requests_ok == 32
    assert result.levels[0].input_tokens == 32 * 128


def test_calibration_stays_inside_a_short_context(standin: Start, client: ClientKind) -> None:
    """A server with a 160-token context and one token per byte: the calibration never sends a prompt the
    server refuses as too long, and every prompt is exactly 120 tokens."""
    s = standin("--count-prompt", "bytes", "--max-model-len", "160")
    plan = BenchPlan(concurrency=(2,), prompt_tokens=120, max_tokens=4, requests=8)
    result = asyncio.run(run_bench(BenchTarget(s.url), plan, client=client))
    assert (result.levels[0].requests_ok, result.levels[0].input_tokens) == (8, 8 * 120)


def test_no_two_runs_share_a_prompt_prefix(standin: Start, client: ClientKind) -> None:
    """Two runs with the same seed against one server: no two prompts share their first 16 characters (at
    most 16 tokens: vLLM's first cache block), so no prefix-cache entry serves another prompt."""
    s = standin("--record-prompts")
    plan = BenchPlan(concurrency=(2,), prompt_tokens=32, max_tokens=2, requests=8, seed=7)
    for _ in range(2):
        asyncio.run(run_bench(BenchTarget(s.url), plan, client=client))
    prompts = httpx.get(s.url + "/standin/prompts").json()["prompts"]
    assert len(prompts) >= 16
    assert len({p[:16] for p in prompts}) == len(prompts)


def test_chat_endpoint_is_measured_too(standin: Start, client: ClientKind) -> None:
    """endpoint='chat' streams /v1/chat/completions and counts usage the same way."""
    s = standin()
    result = asyncio.run(
        run_bench(
            BenchTarget(s.url, endpoint="chat"), BenchPlan(concurrency=(2,), max_tokens=5, requests=3), client=client
        )
    )
    lv = result.levels[0]
    assert (result.endpoint, lv.output_tokens, lv.ttft_ms.count) == ("chat", 15, 3)


def test_duration_mode_finishes_requests_in_flight_at_the_deadline(standin: Start, client: ClientKind) -> None:
    """With --duration, every request started before the deadline completes and counts."""
    s = standin("--chunk-delay", "0.01")
    result = asyncio.run(
        run_bench(BenchTarget(s.url), BenchPlan(concurrency=(3,), max_tokens=10, duration_s=0.5), client=client)
    )
    lv = result.levels[0]
    assert (lv.requests_ok >= 3, lv.requests_failed, lv.output_tokens, lv.complete) == (
        True,
        0,
        lv.requests_ok * 10,
        True,
    )


def test_failed_requests_are_counted_by_kind(standin: Start, client: ClientKind) -> None:
    """A server whose completions fail yields errors {'http_500': n} and no tokens."""
    s = standin("--health-ok-but-completions-fail")
    plan = BenchPlan(concurrency=(2,), requests=5, warmup=False)
    result = asyncio.run(run_bench(BenchTarget(s.url), plan, client=client))
    lv = result.levels[0]
    assert ({e.kind: e.count for e in lv.errors}, lv.requests_ok, lv.output_tokens) == ({"http_500": 5}, 0, 0)


def test_connections_lost_mid_stream_are_counted(standin: Start, client: ClientKind) -> None:
    """A server that crashes mid-stream leaves connection_lost errors, then connect errors."""
    s = standin("--chunk-delay", "0.05", "--crash-after", "0.5")
    plan = BenchPlan(concurrency=(2,), max_tokens=100, duration_s=1.5, warmup=False)
    result = asyncio.run(run_bench(BenchTarget(s.url, model="tiny-standin"), plan, client=client))
    kinds = {e.kind for e in result.levels[0].errors}
    assert ("connection_lost" in kinds, kinds <= {"connection_lost", "connect"}) == (True, True)


def test_a_failing_warm_up_raises_health_check_failed(standin: Start, client: ClientKind) -> None:
    """If even the warm-up request fails, the run stops with an error naming the URL and the cause."""
    s = standin("--health-ok-but-completions-fail")
    with pytest.raises(HealthCheckFailed, match=rf"{s.url}/v1/completions.*http_500"):
        asyncio.run(run_bench(BenchTarget(s.url), BenchPlan(concurrency=(1,), requests=1), client=client))


def test_an_unreachable_target_is_a_transport_error(standin: Start, client: ClientKind) -> None:
    """Nothing listening: the model lookup fails with TransportError naming the URL."""
    s = standin()
    url = s.url
    s.kill()
    with pytest.raises(TransportError, match=url):
        asyncio.run(run_bench(BenchTarget(url), BenchPlan(concurrency=(1,), requests=1), client=client))


def test_progress_reports_while_running_and_once_per_level_done(standin: Start, client: ClientKind) -> None:
    """The callback sees live snapshots and one done=True snapshot per level with its totals."""
    s = standin("--chunk-delay", "0.01")
    seen: list[Progress] = []
    gen = LoadGenerator(
        BenchTarget(s.url),
        BenchPlan(concurrency=(1, 2), max_tokens=20, requests=4),
        on_progress=seen.append,
        progress_interval_s=0.05,
        client=client,
    )
    asyncio.run(gen.run())
    done = [(p.concurrency, p.requests_ok, p.output_tokens) for p in seen if p.done]
    assert (done, any(not p.done and p.streamed_tokens > 0 for p in seen)) == ([(1, 4, 80), (2, 4, 80)], True)


def test_cancelling_keeps_the_finished_requests(standin: Start, client: ClientKind) -> None:
    """Cancelling run() mid-level leaves partial_result() with the requests that finished."""
    s = standin("--chunk-delay", "0.01")

    async def scenario() -> LoadGenerator:
        enough = asyncio.Event()
        gen = LoadGenerator(
            BenchTarget(s.url),
            BenchPlan(concurrency=(2,), max_tokens=5, duration_s=600),
            on_progress=lambda p: enough.set() if p.requests_ok >= 3 else None,
            progress_interval_s=0.02,
            client=client,
        )
        task = asyncio.create_task(gen.run())
        await enough.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return gen

    partial = asyncio.run(scenario()).partial_result()
    lv = partial.levels[0]
    assert (partial.complete, lv.complete, lv.requests_ok >= 3, lv.output_tokens) == (
        False,
        False,
        True,
        lv.requests_ok * 5,
    )


def test_ctrl_c_returns_partial_results(standin: Start, client: ClientKind) -> None:
    """SIGINT during run_bench_blocking returns what finished, marked incomplete, instead of raising
    (tests/conftest.py gives the suite Python's SIGINT handler even when started with SIGINT ignored)."""
    s = standin("--chunk-delay", "0.01")
    started = threading.Event()

    def interrupt() -> None:
        started.wait()  # no fallback on a timer: SIGINT only once two requests of the level finished
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    # 600 s of work: the level provably has work left when SIGINT comes, however slow the machine
    result = run_bench_blocking(
        BenchTarget(s.url),
        BenchPlan(concurrency=(2,), max_tokens=5, duration_s=600),
        # a failed request ends the wait too: the assertion then says so
        on_progress=lambda p: started.set() if p.requests_ok >= 2 or p.requests_failed else None,
        client=client,
    )
    lv = result.levels[0]
    assert (result.complete, lv.requests_ok >= 2, lv.requests_failed) == (False, True, 0), lv.errors


def test_kept_traces_hold_each_levels_window_and_requests() -> None:
    """keep_traces: per level its window on perf_counter (the reference's duration: first send to last
    request done) and every request in it, so another tool's timestamps can be lined up with ours."""
    s = StandinServer("--served-name", "tiny-standin").wait_listening()
    try:
        gen = LoadGenerator(BenchTarget(s.url), BenchPlan(concurrency=(2,), max_tokens=4, requests=5), keep_traces=True)
        before = time.perf_counter()
        result = asyncio.run(gen.run())
    finally:
        s.kill()
    (trace,) = gen.traces
    first = min(o.start for o in trace.outcomes)
    last = max(o.end for o in trace.outcomes)
    assert (len(trace.outcomes), before <= trace.start <= first, last <= trace.end) == (5, True, True)
    assert trace.end - trace.start == result.levels[0].duration_s
