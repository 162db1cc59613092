"""A clock tests move by hand."""

from __future__ import annotations

from typing import Any


class FakeClock:
    """Time that only moves when someone sleeps: deterministic deadlines with no waiting."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = 0.0
        self.start = start
        self.on_sleep: list[Any] = []

    def now(self) -> float:
        return self.start + self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        for hook in self.on_sleep:
            hook()
