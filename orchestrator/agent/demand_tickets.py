"""Models on demand, the waiting requests: a ticket per request the front proxy holds, the on-demand
switch a host runs for them, and what the broker's loops share about both (agent/demand.py)."""

from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from orchestrator.agent.metrics import Metrics
from orchestrator.agent.server import Job
from orchestrator.core.demand import Reject


@dataclass(eq=False)
class Ticket:
    """One held request: its model, when it arrived (monotonic), and its answer once there is one."""

    id: int
    model: str  # the catalog name ("" when the name was not found)
    host: str
    arrived: float
    deadline_s: float  # the model's demand deadline from its state on arrival (warm or cold)
    stream: bool = False
    limit_s: float = 0.0  # the longest it is held: the cold deadline (the proxy holds it 2 s longer)
    answer: dict[str, Any] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    answered_at: float | None = None  # when it was answered (monotonic)
    # ready, and the proxy took it (closed its end of the demand socket): HAProxy counts it at its
    # engine from a moment after this (monotonic; None: not yet, or not known)
    taken_at: float | None = None
    # written to when answered, so a connection's handler can wait on its socket and the answer at once
    _pipe: tuple[int, int] | None = None

    def fileno(self) -> int:
        if self._pipe is None:
            self._pipe = os.pipe()
            if self.done.is_set():
                os.write(self._pipe[1], b"x")
        return self._pipe[0]

    def settle(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.done.set()
        if self._pipe is not None:
            os.write(self._pipe[1], b"x")

    def close(self) -> None:
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None


TIMELINE_MAX = 80  # a swap's timeline keeps this many marks (a cold start's waiting lines are left out)


@dataclass
class Swap:
    """The on-demand switch running on a host."""

    model: str
    cold: bool
    started: float
    job: Job | None = None
    cancelled: int = 0  # its requests that went away meanwhile
    settled: bool = False  # its requests were answered from its result
    abandoned: bool = False  # given up: nobody waited any more
    # its target checked awake (the switch entered `routing`): its requests go to the engine from then
    # on, before the proxy's reload that routes it; cleared if the switch then rolls back
    released: bool = False
    waits: list[float] = field(default_factory=list)  # the waits of the requests it released
    arrived: float | None = None  # its oldest waiting request's arrival (monotonic), where its wait began
    # (monotonic, what): the swap's own progress as its job reported it, with the broker's marks (decided,
    # released, settled): where a held request's wait goes, recorded with the swap (history's demand row)
    timeline: list[tuple[float, str]] = field(default_factory=list)

    def mark(self, at: float, what: str) -> None:
        if len(self.timeline) < TIMELINE_MAX:
            self.timeline.append((at, what))

    def timeline_ms(self) -> list[tuple[int, str]]:
        """The timeline in ms from the oldest request's arrival (else from the swap's start)."""
        base = self.arrived if self.arrived is not None else self.started
        return [(round(1000 * (t - base)), what) for t, what in self.timeline]


@dataclass
class Waiting:
    """What the broker's passes, the socket's connections and the jobs share, under ``lock``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    tickets: dict[str, list[Ticket]] = field(default_factory=dict)  # model -> its waiting tickets, oldest first
    swaps: dict[str, deque[float]] = field(default_factory=dict)  # host -> when its recent swaps began
    running: dict[str, Swap] = field(default_factory=dict)  # host -> the on-demand switch running there
    idle_jobs: dict[str, Job] = field(default_factory=dict)  # host -> the idle sleep or stop running there
    last_request: dict[str, float] = field(default_factory=dict)  # model -> its last request (monotonic)
    # model -> while it served, the later of its last request and when it came up (monotonic): once it
    # sleeps, its idle_stop_s counts from this (HAProxy no longer reports on it then)
    idle_from: dict[str, float] = field(default_factory=dict)
    yielding: dict[str, str] = field(default_factory=dict)  # host -> the operator's operation waiting for our job
    backoff: dict[str, tuple[float, str]] = field(default_factory=dict)  # host -> (until, why): its lock held elsewhere

    def oldest(self, host: str) -> float | None:
        """When the oldest request held for a model of ``host`` arrived (None: none waits)."""
        return min((t.arrived for q in list(self.tickets.values()) for t in list(q) if t.host == host), default=None)

    def waits_on(self, host: str) -> bool:
        """Whether a request for a model of ``host`` waits."""
        return any(t.host == host for q in list(self.tickets.values()) for t in list(q))


def reply(reject: Reject) -> dict[str, Any]:
    return {"status": reject.status, "message": reject.message, "retry_after_s": reject.retry_after_s}


def answer(ticket: Ticket, answer: dict[str, Any], outcome: str, metrics: Metrics, now: float) -> None:
    """Settle ``ticket`` and count how it ended (its wait; a refusal by status)."""
    ticket.answered_at = now
    ticket.settle(answer)
    if ticket.model:
        metrics.demand_wait(
            ticket.model, outcome if outcome == "ready" else str(answer.get("status")), now - ticket.arrived
        )
        if "status" in answer:
            metrics.demand_rejected(ticket.model, int(answer["status"]))
