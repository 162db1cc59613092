"""What a benchmark asks for and what it measured, as frozen values with JSON round trips.

Definitions match ``vllm bench serve``: output tok/s = sum of usage.completion_tokens of the
successful requests / level duration (first request sent to last request finished); TTFT, ITL,
TPOT ((latency - TTFT) / (tokens - 1)) and end-to-end latency are summarized over successful
requests, ITL over every gap of every request. Per-stream tok/s is what one user sees: the
successful requests' completion tokens / the sum of their latencies (a token-weighted mean, which
a few very short requests cannot inflate; ~ aggregate / C in a steady state); ``stream_tok_s``
holds the distribution of each request's own tokens / latency.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.errors import UsageError
from orchestrator.loadgen.sse import RequestOutcome
from orchestrator.loadgen.stats import Distribution, rate, summarize

Endpoint = Literal["completions", "chat"]


@dataclass(frozen=True, slots=True)
class BenchTarget:
    """An OpenAI-compatible server: base URL without /v1; model None = the first of /v1/models."""

    base_url: str
    model: str | None = None
    endpoint: Endpoint = "completions"
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise UsageError(f"bench target {self.base_url!r}: base URL must start with http:// or https://")
        if self.endpoint not in ("completions", "chat"):
            raise UsageError(f"bench endpoint {self.endpoint!r}: must be 'completions' or 'chat'")


@dataclass(frozen=True, slots=True)
class BenchPlan:
    """Per concurrency level: run ``duration_s`` seconds or ``requests`` requests (exactly one).

    In duration mode no request starts after the deadline and those in flight finish.
    Neither given means 30 s per level.
    """

    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    max_tokens: int = 512
    prompt_tokens: int = 128
    duration_s: float | None = None
    requests: int | None = None
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    warmup: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError(f"bench concurrency {self.concurrency!r}: needs levels of at least 1")
        for name in ("max_tokens", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise UsageError(f"bench {name} {getattr(self, name)!r}: must be at least 1")
        if self.duration_s is not None and self.requests is not None:
            raise UsageError("bench: give --duration or --requests, not both")
        if self.duration_s is not None and not self.duration_s > 0:
            raise UsageError(f"bench duration {self.duration_s!r}: must be positive")
        if self.requests is not None and self.requests < 1:
            raise UsageError(f"bench requests {self.requests!r}: must be at least 1")

    @property
    def effective_duration_s(self) -> float | None:
        return 30.0 if self.duration_s is None and self.requests is None else self.duration_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": list(self.concurrency),
            "max_tokens": self.max_tokens,
            "prompt_tokens": self.prompt_tokens,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "ignore_eos": self.ignore_eos,
            "request_timeout_s": self.request_timeout_s,
            "warmup": self.warmup,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchPlan:
        return cls(
            concurrency=tuple(d["concurrency"]),
            max_tokens=d["max_tokens"],
            prompt_tokens=d["prompt_tokens"],
            duration_s=d["duration_s"],
            requests=d["requests"],
            ignore_eos=d["ignore_eos"],
            request_timeout_s=d["request_timeout_s"],
            warmup=d["warmup"],
            seed=d["seed"],
        )


@dataclass(frozen=True, slots=True)
class ErrorCount:
    kind: str
    count: int
    example: str


@dataclass(frozen=True, slots=True)
class LevelResult:
    """Figures of one concurrency level; ``complete`` is False when it was cut short by a cancel."""

    concurrency: int
    complete: bool
    duration_s: float
    requests_ok: int
    requests_failed: int
    input_tokens: int
    output_tokens: int
    output_tok_s: float
    output_tok_s_per_stream: float
    requests_per_s: float
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    stream_tok_s: Distribution
    errors: tuple[ErrorCount, ...] = ()

    @classmethod
    def from_outcomes(
        cls, concurrency: int, outcomes: Iterable[RequestOutcome], duration_s: float, *, complete: bool = True
    ) -> LevelResult:
        done = list(outcomes)
        ok = [o for o in done if o.ok]
        failed = [o for o in done if not o.ok]
        kinds = Counter(o.error_kind for o in failed)
        examples: dict[str, str] = {}
        for o in failed:
            examples.setdefault(o.error_kind, o.error)
        output = sum(o.completion_tokens for o in ok)
        timed = [o for o in ok if o.latency > 0]
        per_stream = [o.completion_tokens / o.latency for o in timed]
        return cls(
            concurrency=concurrency,
            complete=complete,
            duration_s=duration_s,
            requests_ok=len(ok),
            requests_failed=len(failed),
            input_tokens=sum(o.prompt_tokens for o in ok),
            output_tokens=output,
            output_tok_s=rate(output, duration_s),
            output_tok_s_per_stream=rate(sum(o.completion_tokens for o in timed), math.fsum(o.latency for o in timed)),
            requests_per_s=rate(len(ok), duration_s),
            ttft_ms=summarize((o.ttft for o in ok), 1000.0),
            itl_ms=summarize((gap for o in ok for gap in o.itl), 1000.0),
            tpot_ms=summarize(
                ((o.latency - o.ttft) / (o.completion_tokens - 1) for o in ok if o.completion_tokens > 1), 1000.0
            ),
            e2e_ms=summarize((o.latency for o in ok), 1000.0),
            stream_tok_s=summarize(per_stream),
            errors=tuple(ErrorCount(k, n, examples[k]) for k, n in sorted(kinds.items())),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "complete": self.complete,
            "duration_s": self.duration_s,
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "output_tok_s_per_stream": self.output_tok_s_per_stream,
            "requests_per_s": self.requests_per_s,
            "ttft_ms": self.ttft_ms.to_dict(),
            "itl_ms": self.itl_ms.to_dict(),
            "tpot_ms": self.tpot_ms.to_dict(),
            "e2e_ms": self.e2e_ms.to_dict(),
            "stream_tok_s": self.stream_tok_s.to_dict(),
            "errors": {e.kind: e.count for e in self.errors},
            "error_examples": {e.kind: e.example for e in self.errors},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LevelResult:
        dist = Distribution.from_dict
        examples = d.get("error_examples", {})
        return cls(
            concurrency=d["concurrency"],
            complete=d["complete"],
            duration_s=d["duration_s"],
            requests_ok=d["requests_ok"],
            requests_failed=d["requests_failed"],
            input_tokens=d["input_tokens"],
            output_tokens=d["output_tokens"],
            output_tok_s=d["output_tok_s"],
            output_tok_s_per_stream=d["output_tok_s_per_stream"],
            requests_per_s=d["requests_per_s"],
            ttft_ms=dist(d["ttft_ms"]),
            itl_ms=dist(d["itl_ms"]),
            tpot_ms=dist(d["tpot_ms"]),
            e2e_ms=dist(d["e2e_ms"]),
            stream_tok_s=dist(d["stream_tok_s"]),
            errors=tuple(ErrorCount(k, n, examples.get(k, "")) for k, n in d["errors"].items()),
        )


@dataclass(frozen=True, slots=True)
class BenchResult:
    """A whole run; ``complete`` is False when it was cancelled (levels hold what finished)."""

    base_url: str
    model: str
    endpoint: Endpoint
    plan: BenchPlan
    started_at: str  # ISO 8601, UTC
    complete: bool
    levels: tuple[LevelResult, ...] = field(default=())
    client: str = ""  # the HTTP client that measured it: aiohttp or httpx

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    @property
    def single_stream_tok_s(self) -> float | None:
        """Per-stream tok/s at C=1: the figure a post-switch gate compares between revisions."""
        lv = self.level(1)
        return lv.output_tok_s_per_stream if lv is not None and lv.requests_ok else None

    @property
    def peak_output_tok_s(self) -> float | None:
        """Highest aggregate output tok/s over the levels: the headline for history."""
        return max((lv.output_tok_s for lv in self.levels if lv.requests_ok), default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "base_url": self.base_url,
            "model": self.model,
            "endpoint": self.endpoint,
            "plan": self.plan.to_dict(),
            "started_at": self.started_at,
            "complete": self.complete,
            "levels": [lv.to_dict() for lv in self.levels],
            "client": self.client,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchResult:
        return cls(
            base_url=d["base_url"],
            model=d["model"],
            endpoint=d["endpoint"],
            plan=BenchPlan.from_dict(d["plan"]),
            started_at=d["started_at"],
            complete=d["complete"],
            levels=tuple(LevelResult.from_dict(lv) for lv in d["levels"]),
            client=d.get("client", ""),
        )


@dataclass(frozen=True, slots=True)
class Progress:
    """A live snapshot of the level being run; ``streamed_tokens`` counts events (display only)."""

    level_index: int
    levels: int
    concurrency: int
    elapsed_s: float
    target: str  # "30s" or "200 requests"
    requests_ok: int
    requests_failed: int
    in_flight: int
    output_tokens: int
    streamed_tokens: int
    done: bool = False

    @property
    def streamed_tok_s(self) -> float:
        return rate(self.streamed_tokens, self.elapsed_s)
