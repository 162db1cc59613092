"""The agent's background loops: a failure in one pass is recorded and the loop goes on; a loop
that stops beating is reported, so the main loop withholds its watchdog pings and systemd restarts
the agent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from orchestrator import logs
from orchestrator.agent.metrics import Metrics
from orchestrator.core.watch import LoopBeat, dead_loops
from orchestrator.errors import OrchestratorError
from orchestrator.ports import Clock

log = logs.get_logger()

EventSink = Callable[[float, str | None, str, dict[str, Any]], None]


class Failures:
    """Records loop failures: the metric counts every one; the state store and the log get the first
    of a run of identical ones (a host down for an hour is one event, not 3,600), and its end."""

    def __init__(self, clock: Clock, record_event: EventSink, metrics: Metrics) -> None:
        self.clock = clock
        self.record_event = record_event
        self.metrics = metrics
        self.current: dict[tuple[str, str | None], str] = {}
        self.lock = threading.Lock()

    def failed(self, loop: str, host: str | None, exc: BaseException) -> None:
        message = str(exc) if isinstance(exc, OrchestratorError) else f"{type(exc).__name__}: {exc}"
        self.metrics.loop_failure(loop)
        with self.lock:
            new = self.current.get((loop, host)) != message
            self.current[(loop, host)] = message
        if not new:
            return
        if isinstance(exc, OrchestratorError):
            log.warning("loop_pass_failed", loop=loop, host=host, error=message)
        else:  # not one of ours: a bug, worth its traceback
            log.error("loop_pass_failed", loop=loop, host=host, error=message, exc_info=exc)
        self.record(host, "loop_failed", {"loop": loop, "error": message})

    def ok(self, loop: str, host: str | None) -> None:
        with self.lock:
            was = self.current.pop((loop, host), None)
        if was is not None:
            log.info("loop_pass_recovered", loop=loop, host=host)
            self.record(host, "loop_recovered", {"loop": loop, "after": was})

    def record(self, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        try:
            self.record_event(self.clock.now(), host, kind, detail)
        except Exception as exc:  # noqa: BLE001 - the store itself failing must not end the loop that reports it
            log.error("event_not_recorded", kind=kind, error=repr(exc), **detail)


class Loop:
    """A named thread that runs ``tick`` until the agent stops; ``tick`` returns the seconds to wait."""

    def __init__(
        self,
        name: str,
        tick: Callable[[], float],
        *,
        stopping: threading.Event,
        clock: Clock,
        failures: Failures,
        limit_s: float,
        retry_s: float = 5.0,
        wake: threading.Event | None = None,
    ) -> None:
        """``wake``: set, it ends the wait before the next pass at once (whoever stops the loop sets it too)."""
        self.name = name
        self.wake = wake
        self.tick = tick
        self.stopping = stopping
        self.clock = clock
        self.failures = failures
        self.limit_s = limit_s
        self.retry_s = retry_s
        self.last_beat = clock.monotonic()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.last_beat = self.clock.monotonic()
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            self.last_beat = self.clock.monotonic()
            try:
                wait = self.tick()
            except Exception as exc:  # noqa: BLE001 - the agent's top loop: record, and try again
                self.failures.failed(self.name, None, exc)
                wait = self.retry_s
            else:
                self.failures.ok(self.name, None)
            if self.wake is None:
                self.stopping.wait(wait)
            else:
                self.wake.wait(wait)
                self.wake.clear()

    def beat(self) -> LoopBeat:
        return LoopBeat(alive=self.thread.is_alive(), last_beat=self.last_beat, limit_s=self.limit_s)


def dead(loops: list[Loop], clock: Clock) -> list[str]:
    """The loops that exited or stopped beating (see core.watch.dead_loops)."""
    return dead_loops({loop.name: loop.beat() for loop in loops}, clock.monotonic())
