"""Pure statistics for benchmark figures: percentiles and distribution summaries.

Percentiles interpolate linearly between closest ranks, the same rule as ``numpy.percentile``'s
default (which ``vllm bench serve`` uses), so figures from both tools are comparable.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of one metric; all fields share the unit named by the field holding it."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-safe: NaN (no samples) becomes None."""
        return {
            "count": self.count,
            "mean": _json(self.mean),
            "p50": _json(self.p50),
            "p90": _json(self.p90),
            "p99": _json(self.p99),
        }

    @classmethod
    def from_dict(cls, data: dict[str, float | int | None]) -> Distribution:
        return cls(
            count=int(data["count"] or 0),
            mean=_float(data["mean"]),
            p50=_float(data["p50"]),
            p90=_float(data["p90"]),
            p99=_float(data["p99"]),
        )


def _json(x: float) -> float | None:
    return None if math.isnan(x) else x


def _float(x: float | None) -> float:
    return math.nan if x is None else float(x)


EMPTY = Distribution(count=0, mean=math.nan, p50=math.nan, p90=math.nan, p99=math.nan)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values; NaN when there are none."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    rank = (n - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    frac = rank - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values: Iterable[float], scale: float = 1.0) -> Distribution:
    """Count, mean and p50/p90/p99 of values, each multiplied by scale (e.g. 1000 for s -> ms)."""
    data = sorted(v * scale for v in values)
    if not data:
        return EMPTY
    return Distribution(
        count=len(data),
        mean=math.fsum(data) / len(data),
        p50=percentile(data, 50),
        p90=percentile(data, 90),
        p99=percentile(data, 99),
    )


def rate(amount: float, seconds: float) -> float:
    """amount per second; 0 when no time has passed (nothing measured yet)."""
    return amount / seconds if seconds > 0 else 0.0
