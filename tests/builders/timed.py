"""An adapter stand-in that times every call of the one it wraps: the profiles of the warm path
(bench/warm/profile.py in the bench's process, tests/agent_with_hooks.py --time-calls in the agent)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

Record = Callable[[float, float, str], None]  # start, end, "port.method"


class Timed:
    """Stands in for one adapter: each method call goes to ``record`` with its start and end (``clock``)."""

    def __init__(self, inner: Any, name: str, record: Record, clock: Callable[[], float] = time.monotonic) -> None:
        self._inner, self._name, self._record, self._clock = inner, name, record, clock

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if not callable(value):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = self._clock()
            try:
                return value(*args, **kwargs)
            finally:
                self._record(t0, self._clock(), f"{self._name}.{attr}")

        return timed
