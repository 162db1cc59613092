"""Await a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], done: Callable[[T], bool], *, timeout: float = 30.0,
             what: str = "condition") -> T:
    """Call probe until done(value) holds; return that value, or fail naming the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:g} s; last value: {value!r}")
        time.sleep(0.05)
