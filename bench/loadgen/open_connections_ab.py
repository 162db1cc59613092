#!/usr/bin/env python3
"""The load generator with and without opening each level's connections before its window, in turns,
against one running server: each run's rate, its head (the first 10% of its span, as
bench/loadgen/vllm_compare.py counts it) and how long its first C requests took to get a first token, with
vllm_compare's /metrics sampler beside every run as there (--sample-interval 0: none).

    .venv/bin/python bench/loadgen/open_connections_ab.py --url http://127.0.0.1:8000 --model tiny-a --pairs 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.loadgen.vllm_compare import Sampler, ours_times, window_figures
from orchestrator.loadgen import BenchPlan, BenchTarget, LoadGenerator


class WithoutOpening(LoadGenerator):
    """The load generator as it was: the level begins with the calibration's one open connection."""

    async def _open_connections(self, client: Any, concurrency: int) -> None:
        return None


def one(a: argparse.Namespace, cls: type[LoadGenerator]) -> dict[str, float]:
    plan = BenchPlan(
        concurrency=(a.concurrency,), requests=a.requests, prompt_tokens=128, max_tokens=128, ignore_eos=True
    )
    gen = cls(BenchTarget(a.url, model=a.model), plan, keep_traces=True)
    # as in bench/loadgen/vllm_compare.py: /metrics scraped on a new connection every --sample-interval s
    sampler = Sampler(sys.executable, a.url, a.sample_interval) if a.sample_interval > 0 else None
    try:
        lv = asyncio.run(gen.run()).levels[0]
    finally:
        if sampler is not None:
            sampler.stop()
    trace = gen.traces[0]
    times, first, last = ours_times(trace)
    win = window_figures(times, lv.output_tokens, (first, last), [])
    starts = sorted(trace.outcomes, key=lambda o: o.start)[: a.concurrency]
    return {
        "tok_s": lv.output_tok_s,
        "head_tok_s": win["head_tok_s"],
        "steady_tok_s": win["steady_tok_s"],
        "first_c_all_first_token_s": max(o.start + o.ttft for o in starts) - trace.start,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--sample-interval", type=float, default=0.25, help="0: no /metrics sampler beside the runs")
    a = p.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"without": [], "with": []}
    for i in range(a.pairs):
        order = ("without", "with") if i % 2 == 0 else ("with", "without")
        for name in order:
            r = one(a, WithoutOpening if name == "without" else LoadGenerator)
            rows[name].append(r)
            print(
                f"pair {i + 1} {name:8} connections opened first: {r['tok_s']:8.1f} tok/s,"
                f" head {r['head_tok_s']:7.1f}, steady {r['steady_tok_s']:7.1f},"
                f" all first {a.concurrency} have a token after {r['first_c_all_first_token_s']:.2f} s;"
                f" load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    for name, rs in rows.items():
        print(
            f"{name:8} medians: {statistics.median(r['tok_s'] for r in rs):.1f} tok/s, head"
            f" {statistics.median(r['head_tok_s'] for r in rs):.1f}, first {a.concurrency} served after"
            f" {statistics.median(r['first_c_all_first_token_s'] for r in rs):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
