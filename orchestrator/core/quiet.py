"""When a warm switch moves its route: at a quiet moment of the engines it displaces (pure).

The displaced engine sleeps with mode=wait: it finishes what it serves first, and the target wakes only
after that, so a request still running on it when the route moves (a long stream) adds its remaining
time to every client's gap. Before the route moves, the displaced engine still serves and nobody waits:
so the switch polls the proxy's count of what is in flight to those engines (HAProxy's current sessions
per server, every worker) and moves the route the moment it reads none, or when ``quiet_wait_s`` has
passed (then as it would without the wait: the drain waits for what is left).

"Quiet" means no session at all, not "no session older than some age": HAProxy's ``show stat`` gives a
count per server and no ages (``show sess`` has them, to the second), and a young session says nothing
about what is left of it: a 64-token stream 5 ms in holds the drain as long as at its start. A short
request let pass costs the wait one more reading instead (bench/warm/RESULTS.md has the figures). A
session is a request in flight to the engine: a client connection with nothing sent to the engine (idle
keep-alive, a slow client still sending its body) has no server session, so it never holds the wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.core.haproxy_cli import Sessions

QUIET_POLL_S = 0.01  # between two readings: a short request (~10 ms) ends within about one


@dataclass(frozen=True)
class Quiet:
    """One reading's verdict: whether the route moves now, why, and what was in flight."""

    move: bool
    outcome: str  # "quiet" (none in flight) | "bound" (quiet_wait_s passed) | "unknown" (no count) | "waiting"
    in_flight: int  # sessions to the engines at this reading (0 when unknown)


def in_flight(counts: Mapping[tuple[str, int], Sessions], engines: Iterable[tuple[str, int]]) -> int:
    """Requests in flight to ``engines``; an engine the proxy has no server for has none through it."""
    return sum(counts[e].current for e in engines if e in counts)


def verdict(
    counts: Mapping[tuple[str, int], Sessions] | None,
    engines: Iterable[tuple[str, int]],
    waited_s: float,
    bound_s: float,
) -> Quiet:
    """The route moves when nothing is in flight to ``engines``, when the proxy could not count
    (``counts`` None: waiting would only delay the switch blind), or once ``waited_s`` reached
    ``bound_s``; otherwise the switch reads again after QUIET_POLL_S."""
    if counts is None:
        return Quiet(True, "unknown", 0)
    busy = in_flight(counts, engines)
    if busy == 0:
        return Quiet(True, "quiet", 0)
    if waited_s >= bound_s:
        return Quiet(True, "bound", busy)
    return Quiet(False, "waiting", busy)
