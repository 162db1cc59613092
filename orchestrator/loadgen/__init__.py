"""Benchmarking a deployment: an async streaming load generator and its results.

from orchestrator.loadgen import BenchPlan, BenchTarget, run_bench_blocking
result = run_bench_blocking(BenchTarget("http://127.0.0.2:8000"), BenchPlan(concurrency=(1, 16)))
json.dumps(result.to_dict())
"""

from __future__ import annotations

from orchestrator.loadgen.http import ClientKind
from orchestrator.loadgen.loadgen import (
    LevelTrace,
    LoadGenerator,
    ProgressCallback,
    run_bench,
    run_bench_blocking,
)
from orchestrator.loadgen.model import (
    BenchPlan,
    BenchResult,
    BenchTarget,
    Endpoint,
    ErrorCount,
    LevelResult,
    Progress,
)
from orchestrator.loadgen.stats import Distribution

__all__ = [
    "BenchPlan",
    "BenchResult",
    "BenchTarget",
    "ClientKind",
    "Distribution",
    "Endpoint",
    "ErrorCount",
    "LevelResult",
    "LevelTrace",
    "LoadGenerator",
    "Progress",
    "ProgressCallback",
    "run_bench",
    "run_bench_blocking",
]
