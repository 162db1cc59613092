"""The post-switch smoke benchmark and the figures history keeps from any benchmark."""

from __future__ import annotations

from typing import Any

from orchestrator.core.records import UnitSpec
from orchestrator.loadgen import BenchPlan, BenchTarget, run_bench_blocking


def bench_record(result: dict[str, Any]) -> dict[str, Any]:
    """The whole result plus its headlines: single-stream tok/s (C=1) and the peak aggregate."""
    levels = result.get("levels") or []
    c1 = next((lv for lv in levels if lv["concurrency"] == 1 and lv["requests_ok"]), None)
    peak = max((lv["output_tok_s"] for lv in levels if lv["requests_ok"]), default=None)
    return {**result, "headline_tok_s": c1["output_tok_s_per_stream"] if c1 else None, "peak_tok_s": peak}


class SmokeBench:
    """A few single-stream requests right after a switch: enough for a regression gate, not a study."""

    def __init__(self, requests: int = 4, max_tokens: int = 64) -> None:
        self.plan = BenchPlan(concurrency=(1,), requests=requests, max_tokens=max_tokens, prompt_tokens=32)

    def run(self, spec: UnitSpec) -> dict[str, Any]:
        result = run_bench_blocking(BenchTarget(base_url=spec.base_url, model=spec.served_name), self.plan)
        return bench_record(result.to_dict())
