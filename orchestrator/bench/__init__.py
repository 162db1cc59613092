"""Benchmarking a deployment: an async streaming load generator and its results.

    from orchestrator.bench import BenchPlan, BenchTarget, run_bench_blocking
    result = run_bench_blocking(BenchTarget("http://127.0.0.2:8000"), BenchPlan(concurrency=(1, 16)))
    json.dumps(result.to_dict())
"""

from __future__ import annotations

from orchestrator.bench.http import ClientKind
from orchestrator.bench.loadgen import LoadGenerator, ProgressCallback, run_bench, run_bench_blocking
from orchestrator.bench.model import (
    BenchPlan,
    BenchResult,
    BenchTarget,
    Endpoint,
    ErrorCount,
    LevelResult,
    Progress,
)
from orchestrator.bench.stats import Distribution

__all__ = ["BenchPlan", "BenchResult", "BenchTarget", "ClientKind", "Distribution", "Endpoint", "ErrorCount",
           "LevelResult", "LoadGenerator", "Progress", "ProgressCallback", "run_bench", "run_bench_blocking"]
