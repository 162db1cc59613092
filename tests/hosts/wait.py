"""Await a condition instead of sleeping a fixed time: the one helper every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], done: Callable[[T], Any] = bool, *, timeout: float = 30.0,
             what: str = "condition", interval: float = 0.05) -> T:
    """Call probe until done(value) holds (by default: until the value is truthy); return that
    value, or fail naming what was awaited and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s; last value: {value!r}")
        time.sleep(interval)
