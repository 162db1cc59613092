"""Await a condition instead of sleeping a fixed time: the one helper every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(
    probe: Callable[[], T],
    done: Callable[[T], Any] = bool,
    *,
    timeout: float = 30.0,
    what: str = "condition",
    interval: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call probe until done(value) holds (by default: until the value is truthy); return that
    value, or fail naming what was awaited and the last value seen.

    Between probes it sleeps ``interval`` or as long as the last probe took, whichever is longer: a
    probe that starts a program (the CLI in a test host costs ~0.3 s of CPU) then takes at most half
    a core instead of all of it, on a machine of two cores where what the test awaits needs the rest."""
    deadline = clock() + timeout
    while True:
        started = clock()
        value = probe()
        took = clock() - started
        if done(value):
            return value
        if clock() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s; last value: {value!r}")
        sleep(max(interval, took))
