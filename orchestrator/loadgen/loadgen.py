"""The async load generator: C streaming clients per level against an OpenAI-compatible server.

One HTTP client (aiohttp if installed, else httpx; see http.py) is shared by all levels, with
HTTP/1.1 keep-alive and one connection per concurrent stream.
Per level, C workers each send one streamed request after another until the level's request
count is used up or its deadline passes; requests in flight at the deadline finish and count.
Cancelling ``run`` (or Ctrl-C through ``run_bench_blocking``) keeps every finished request:
``partial_result()`` returns them at any time.
Each level's window is the same as ``vllm bench serve``'s benchmark duration: from just before the
first request is sent to the last request's end (calibration requests come before it). Before the
window every level opens its C connections (C GET /v1/models, each holding its connection until all
C are answered), so all C requests leave at once on open connections: a level that started with
the calibration's one open connection and C-1 to connect had that one request streaming while the
server admitted the others a few at a time over up to a second on the 2-core CPU build
(bench/gpu/RESULTS.md, "Why C=64 read low"). With
``keep_traces`` every request's timings stay in ``traces`` with that window, on the perf_counter
clock (CLOCK_MONOTONIC on Linux: one clock for every process of the host, so another tool's
timestamps and a /metrics sampler's line up with them).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from time import perf_counter
from typing import Any

from orchestrator.errors import HealthCheckFailed, TransportError
from orchestrator.loadgen.http import ClientKind, HttpBackend, default_client, open_backend
from orchestrator.loadgen.model import BenchPlan, BenchResult, BenchTarget, LevelResult, Progress
from orchestrator.loadgen.sse import RequestOutcome, StreamAccumulator, StreamError

ProgressCallback = Callable[[Progress], None]
TAG_DIGITS = 10
CALIBRATION_PROBES = 14  # 1-token requests the prompt-length search may spend (a bisection of ~4 KB)
FAILURE_PAUSE_S = 0.05  # a dead server must not turn the workers into a busy loop of refused connects

# Common English words: about one BPE token each in most tokenizers; calibrated against usage anyway.
_WORDS = """the of and to in is was for on that with as by at from his her it an were are which this be or
has had not but their they one new after first two also who its been more have when time would other into all
during she there over only can most some year about made these while city such may then three where world than
between many under well later both through government school used north until work part since people known war
best life long high found state early game each what team second play being left public music water house film
series name"""
WORDS = tuple(dict.fromkeys(_WORDS.split()))


@dataclass(frozen=True, slots=True)
class LevelTrace:
    """One level's window (perf_counter seconds) and every request it finished."""

    concurrency: int
    start: float
    end: float
    outcomes: tuple[RequestOutcome, ...]


class LoadGenerator:
    """Runs a BenchPlan against a BenchTarget; see the module docstring for the rules."""

    def __init__(
        self,
        target: BenchTarget,
        plan: BenchPlan,
        *,
        on_progress: ProgressCallback | None = None,
        progress_interval_s: float = 0.5,
        client: ClientKind | None = None,
        keep_traces: bool = False,
    ) -> None:
        self.target = target
        self.plan = plan
        self.client: ClientKind = client or default_client()
        self._on_progress = on_progress
        self._interval = progress_interval_s
        self._model = target.model or ""
        self._started_at = ""
        self._levels: list[LevelResult] = []
        self._outcomes: list[RequestOutcome] = []
        self._level_start = 0.0
        self._concurrency = 0
        self._in_flight = 0
        self._streamed = 0
        self._keep_traces = keep_traces
        self.traces: list[LevelTrace] = []
        rng = random.Random(plan.seed)
        # One body per run, cut to the prompt length the server's tokenizer counts (see _calibrate),
        # so every prompt has the same token count; a tokenizer takes at least one token per word.
        self._text = " ".join(rng.choices(WORDS, k=4 * plan.prompt_tokens + 16))
        self._chars = 6 * plan.prompt_tokens  # until calibrated: a guess of about one token per word
        # Each prompt starts with a random tag of single digits: it fills the first prefix-cache block
        # (16 tokens in vLLM), so no prompt shares a cached prefix with another, in this run or an
        # earlier one (block hashes chain: a different first block makes every later block differ).
        # Single digits between spaces tokenize alike whichever digits they are, unlike a number
        # (BPE merges "12" but maybe not "97"), so every prompt keeps the calibrated token count.
        self._tags = random.SystemRandom()
        self._tag_digits = max(1, min(TAG_DIGITS, plan.prompt_tokens // 2))  # short prompts stay short

    async def run(self) -> BenchResult:
        """Every level in order; raises TransportError / HealthCheckFailed if the target cannot serve."""
        self._started_at = datetime.now(UTC).isoformat(timespec="seconds")
        width = max(self.plan.concurrency)
        headers = {"content-type": "application/json"}
        if self.target.api_key:
            headers["authorization"] = f"Bearer {self.target.api_key}"
        client = open_backend(self.client, self.target.base_url, headers, self.plan.request_timeout_s, width)
        try:
            if not self._model:
                self._model = await self._first_model(client)
            if self.plan.warmup:
                await self._calibrate(client)
            for index, concurrency in enumerate(self.plan.concurrency):
                await self._run_level(client, index, concurrency)
        finally:
            await client.aclose()
        return self._result(complete=True)

    def partial_result(self) -> BenchResult:
        """Finished levels plus the finished requests of the level under way (complete=False)."""
        return self._result(complete=False)

    def _result(self, *, complete: bool) -> BenchResult:
        levels = list(self._levels)
        if not complete and self._outcomes:
            end = max(o.end for o in self._outcomes)
            levels.append(
                LevelResult.from_outcomes(self._concurrency, self._outcomes, end - self._level_start, complete=False)
            )
        return BenchResult(
            base_url=self.target.base_url,
            model=self._model,
            endpoint=self.target.endpoint,
            plan=self.plan,
            started_at=self._started_at,
            complete=complete,
            levels=tuple(levels),
            client=self.client,
        )

    # ---- one level --------------------------------------------------------------------------

    async def _run_level(self, client: HttpBackend, index: int, concurrency: int) -> None:
        self._outcomes = []
        self._concurrency = concurrency
        self._streamed = 0
        duration = self.plan.effective_duration_s
        remaining = self.plan.requests or 0
        await self._open_connections(client, concurrency)
        self._level_start = start = perf_counter()
        deadline = start + duration if duration is not None else None

        async def worker() -> None:
            nonlocal remaining
            while True:
                if deadline is not None:
                    if perf_counter() >= deadline:
                        return
                elif remaining <= 0:
                    return
                else:
                    remaining -= 1
                outcome = await self._request(client, self._body())
                self._outcomes.append(outcome)
                if not outcome.ok:
                    await asyncio.sleep(FAILURE_PAUSE_S)

        ticker = asyncio.create_task(self._tick(index)) if self._on_progress else None
        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(concurrency):
                    tg.create_task(worker())
        finally:
            if ticker is not None:
                ticker.cancel()
        end = perf_counter()
        elapsed = end - start
        if self._keep_traces:
            self.traces.append(LevelTrace(concurrency, start, end, tuple(self._outcomes)))
        self._levels.append(LevelResult.from_outcomes(concurrency, self._outcomes, elapsed))
        self._outcomes = []
        if self._on_progress:
            self._on_progress(self._progress(index, elapsed, done=True))

    async def _tick(self, index: int) -> None:
        assert self._on_progress is not None
        while True:
            await asyncio.sleep(self._interval)
            self._on_progress(self._progress(index, perf_counter() - self._level_start))

    def _progress(self, index: int, elapsed: float, *, done: bool = False) -> Progress:
        if done:
            lv = self._levels[-1]
            ok, failed, tokens = lv.requests_ok, lv.requests_failed, lv.output_tokens
        else:
            outcomes = self._outcomes
            ok = sum(1 for o in outcomes if o.ok)
            failed = len(outcomes) - ok
            tokens = sum(o.completion_tokens for o in outcomes)
        duration = self.plan.effective_duration_s
        target = f"{duration:g}s" if duration is not None else f"{self.plan.requests} requests"
        return Progress(
            level_index=index,
            levels=len(self.plan.concurrency),
            concurrency=self._concurrency,
            elapsed_s=elapsed,
            target=target,
            requests_ok=ok,
            requests_failed=failed,
            in_flight=self._in_flight,
            output_tokens=tokens,
            streamed_tokens=self._streamed,
            done=done,
        )

    # ---- one request ------------------------------------------------------------------------

    def _body(self, max_tokens: int | None = None, chars: int | None = None) -> bytes:
        tag = " ".join(self._tags.choices("0123456789", k=self._tag_digits))
        prompt = f"{tag} {self._text[: self._chars if chars is None else chars]}"
        body: dict[str, Any] = {
            "model": self._model,
            "stream": True,
            "temperature": 0.0,
            "stream_options": {"include_usage": True},
        }
        n = max_tokens or self.plan.max_tokens
        if self.target.endpoint == "chat":
            body.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=n)
        else:
            body.update(prompt=prompt, max_tokens=n)
        if self.plan.ignore_eos:
            body["ignore_eos"] = True  # a vLLM extension: every request yields max_tokens tokens
        return json.dumps(body).encode()

    @property
    def _path(self) -> str:
        return "/v1/chat/completions" if self.target.endpoint == "chat" else "/v1/completions"

    async def _request(self, client: HttpBackend, body: bytes) -> RequestOutcome:
        start = perf_counter()
        acc = StreamAccumulator(start)

        def on_data(data: bytes) -> None:
            self._streamed += acc.feed(data, perf_counter())

        self._in_flight += 1
        try:
            status, detail = await client.post_stream(self._path, body, on_data)
            if status != 200:
                return RequestOutcome.failure(
                    start, perf_counter(), f"http_{status}", detail.decode("utf-8", "replace")
                )
            return acc.finish(perf_counter())
        except StreamError as exc:  # transport failures and unusable streams alike
            return RequestOutcome.failure(start, perf_counter(), exc.kind, exc.message)
        finally:
            self._in_flight -= 1

    # ---- before the levels ------------------------------------------------------------------

    async def _first_model(self, client: HttpBackend) -> str:
        try:
            status, body = await client.get("/v1/models")
        except StreamError as exc:
            raise TransportError(f"bench: {self.target.base_url}/v1/models: {exc.kind}: {exc.message}") from exc
        try:
            models = [m["id"] for m in json.loads(body)["data"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise HealthCheckFailed(
                f"bench: {self.target.base_url}/v1/models answered {status} {body[:200]!r}, not a model list"
            ) from exc
        if not models:
            raise HealthCheckFailed(f"bench: {self.target.base_url}/v1/models lists no model")
        return str(models[0])

    async def _open_connections(self, client: HttpBackend, concurrency: int) -> None:
        """C connections open (keep-alive) for the level's C workers: C GETs of /v1/models, each holding
        its connection until all C have their answer (one answered early would otherwise lend its
        connection to the next, and the level would open the rest inside its window). The GET costs the
        server next to nothing; whatever it answers, the connection is open: only a transport failure
        stops the run."""
        try:
            await client.hold_open("/v1/models", concurrency)
        except StreamError as exc:
            raise TransportError(
                f"bench: opening {concurrency} connections to {self.target.base_url}: {exc.kind}: {exc.message}"
            ) from exc

    async def _calibrate(self, client: HttpBackend) -> None:
        """Unmeasured 1-token requests find how much of the run's text makes plan.prompt_tokens as the
        server counts them (chat template and BOS included): words tokenize unevenly, so a per-word
        estimate misses by several percent. The search grows from below (a tokenizer makes at most one
        token of each ASCII character), so no probe is much longer than the target and a server with a
        short context never sees one it must refuse; a refusal (HTTP 400) counts as too long."""
        target = self.plan.prompt_tokens
        lo, lo_tokens = 0, await self._probe(client, 0, refused_ok=False)
        base = lo_tokens  # the tag, template and BOS alone
        hi, hi_tokens = -1, 0  # no upper bound known yet
        for _ in range(CALIBRATION_PROBES):
            if lo_tokens >= target or lo >= len(self._text) or (hi >= 0 and hi - lo <= 1):
                break
            if hi < 0:  # extrapolate from what is known; the first step cannot exceed the target
                guess = target - base if lo == 0 else lo + (target - lo_tokens) * lo // max(1, lo_tokens - base)
                mid = min(max(guess, lo + 1), len(self._text))
            else:  # secant inside the bracket, kept off its ends so that it always shrinks
                guess = lo + (target - lo_tokens) * (hi - lo) // max(1, hi_tokens - lo_tokens)
                mid = min(max(guess, lo + 1), hi - 1)
            tokens = await self._probe(client, mid, refused_ok=True)
            if tokens == target:
                lo, lo_tokens = mid, tokens
                break
            if 0 <= tokens < target:
                lo, lo_tokens = mid, tokens
            else:
                hi, hi_tokens = mid, tokens if tokens >= 0 else 2 * target  # refused: too long
        self._chars = lo  # the longest text found that does not exceed the target

    async def _probe(self, client: HttpBackend, chars: int, *, refused_ok: bool) -> int:
        """The prompt tokens the server counted; -1 when ``refused_ok`` and it answered 400."""
        outcome = await self._request(client, self._body(max_tokens=1, chars=chars))
        if not outcome.ok and refused_ok and outcome.error_kind == "http_400":
            return -1
        if not outcome.ok:
            raise HealthCheckFailed(
                f"bench: warm-up request to {self.target.base_url}{self._path} "
                f"({self._model}) failed: {outcome.error_kind}: {outcome.error}"
            )
        return outcome.prompt_tokens


async def run_bench(
    target: BenchTarget,
    plan: BenchPlan,
    *,
    on_progress: ProgressCallback | None = None,
    client: ClientKind | None = None,
) -> BenchResult:
    """Run the plan; cancellation propagates (use LoadGenerator to keep partial results)."""
    return await LoadGenerator(target, plan, on_progress=on_progress, client=client).run()


def run_bench_blocking(
    target: BenchTarget,
    plan: BenchPlan,
    *,
    on_progress: ProgressCallback | None = None,
    client: ClientKind | None = None,
) -> BenchResult:
    """For a CLI: runs an event loop; Ctrl-C stops it and returns what finished (complete=False)."""
    gen = LoadGenerator(target, plan, on_progress=on_progress, client=client)
    try:
        return asyncio.run(gen.run())
    except KeyboardInterrupt:
        return gen.partial_result()
