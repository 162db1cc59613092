"""Models on demand, pure: given the requests the front proxy holds per model and what the box runs,
decide the next thing to do (wake X, start X, sleep X, stop X, wait until T) and which requests are
turned away (429 with Retry-After). No I/O and no clock of its own: every time is an argument, in the
same monotonic seconds as the arrivals.

Never thrash: at most ``max_swaps_per_min`` swaps (an on-demand wake or start that displaces a
serving model) in any 60 s, spread at least 60 / ``max_swaps_per_min`` s apart (a burst would use up
the minute and leave the other model's requests waiting out the rest of it), counted across agent
restarts (the swaps' records, recorded_swaps); a displaced model is never swapped out within ``min_awake_s`` of coming
up; while a displaced model still has requests (in flight or held) the next model's requests are
batched for up to ``batch_wait_s`` before the swap (in flight: HAProxy's count since those requests
came; the swap goes as soon as it reads none); an operator's operation holds precedence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.core.catalog import Catalog
from orchestrator.core.resident import State

WINDOW_S = 60.0  # the swap cap counts swaps in this window
# A serving model asked at least this many times as much (and this many more) keeps its GPUs.
OUTWEIGH_FACTOR, OUTWEIGH_MARGIN = 2, 2
# Retry-After of a request turned away because a model asked more holds the GPUs it needs.
OUTWEIGHED_RETRY_S = 10


class Kind(StrEnum):
    WAKE = "wake"  # asleep: a warm switch
    START = "start"  # stopped: a cold switch
    SLEEP = "sleep"  # idle: sleep mode keeps it warm
    STOP = "stop"  # idle for longer (or no sleep mode): the engine stops
    WAIT = "wait"  # nothing may happen before ``until`` (None: until something changes)
    NONE = "none"  # nothing waits and nothing is idle


@dataclass(frozen=True)
class Action:
    kind: Kind
    model: str | None = None
    until: float | None = None
    reason: str = ""
    displaces: tuple[str, ...] = ()  # the serving models a wake or start takes the GPUs of

    @property
    def swap(self) -> bool:
        """A wake or start that takes a serving model's GPUs: what the cap counts."""
        return self.kind in (Kind.WAKE, Kind.START) and bool(self.displaces)


@dataclass(frozen=True)
class ModelView:
    """One model of the box as the policy sees it; times are monotonic seconds."""

    name: str
    state: State = State.STOPPED
    on_demand: bool = True
    sleeps: bool = False  # has sleep mode
    priority: int = 0
    min_awake_s: float = 0.0
    idle_sleep_s: float | None = None
    idle_stop_s: float | None = None
    queue_limit: int = 64
    since: float | None = None  # when its current state began (serving: when it came up)
    # the last request seen for it (routed or held); a sleeper's: or when it last came up, if later
    last_request: float | None = None
    # sessions on its engine (HAProxy's scur + qcur), the most seen of late (closed-loop clients' gaps)
    in_flight: int = 0
    waiting: tuple[float, ...] = ()  # arrival times of the held requests, oldest first
    # in flight by a reading taken after the oldest held request arrived (None: none since: in_flight counts)
    current: int | None = None

    @property
    def serving_now(self) -> int:
        """Requests it serves now: the reading since the held requests came, else the recent peak."""
        return self.in_flight if self.current is None else self.current

    @property
    def asked(self) -> int:
        """How many requests want it now: in flight and held (closed-loop clients each hold one)."""
        return self.in_flight + len(self.waiting)


@dataclass(frozen=True)
class Box:
    """The whole box: its models, which cannot serve together, recent swaps and what holds it."""

    models: Mapping[str, ModelView]
    conflicts: Mapping[str, frozenset[str]] = field(default_factory=dict)  # model -> models on its GPUs
    swaps: tuple[float, ...] = ()  # when each recent on-demand swap began
    busy: str | None = None  # an operator's switch, bench or tune: on-demand waits for it
    running: str | None = None  # the model an on-demand swap is bringing up now
    max_swaps_per_min: int = 6
    batch_wait_s: float = 2.0

    def displaced_by(self, name: str) -> tuple[str, ...]:
        return tuple(
            sorted(
                m
                for m in self.conflicts.get(name, frozenset())
                if m in self.models and self.models[m].state is State.SERVING
            )
        )


@dataclass(frozen=True)
class Reject:
    """A held request's final answer other than ready."""

    status: int  # 429, 404 or 503
    message: str
    retry_after_s: int | None = None


def conflicts_of(catalog: Catalog, host: str) -> dict[str, frozenset[str]]:
    """Which models of ``host`` cannot serve beside each other: those on overlapping GPUs (a switch
    to one stops or sleeps the others there); models on disjoint GPUs stay awake together."""
    names = catalog.models_on(host)
    gpus = {n: set(catalog.models[n].gpus) for n in names}
    return {n: frozenset(m for m in names if m != n and gpus[n] & gpus[m]) for n in names}


def _order(m: ModelView) -> tuple[int, int, float, str]:
    # the highest priority first, then the most asked, then the longest waiting
    return (-m.priority, -len(m.waiting), m.waiting[0] if m.waiting else math.inf, m.name)


def swap_spacing_s(box: Box) -> float:
    """The least time between two swaps: the cap's minute shared out evenly."""
    return WINDOW_S / box.max_swaps_per_min


def next_swap_slot(box: Box, now: float) -> float:
    """The earliest time the swap cap allows another swap (``now`` when it allows one already): at most
    ``max_swaps_per_min`` in any WINDOW_S, and ``swap_spacing_s`` after the last one."""
    recent = sorted(t for t in box.swaps if t > now - WINDOW_S)
    slot = recent[-1] + swap_spacing_s(box) if recent else now
    if len(recent) >= box.max_swaps_per_min:
        slot = max(slot, recent[-box.max_swaps_per_min] + WINDOW_S)
    return max(now, slot)


def recorded_swaps(at: Iterable[float], epoch: float, now: float) -> tuple[float, ...]:
    """Swaps recorded at wall-clock times ``at``, as monotonic times (``now`` is the monotonic time at
    wall-clock ``epoch``): those of the last WINDOW_S, oldest first, none later than now (a clock
    stepped back). A restarted agent keeps counting the swaps its previous run made."""
    return tuple(sorted(now - min(WINDOW_S, max(0.0, epoch - t)) for t in at if epoch - t < WINDOW_S))


def _cap_reason(box: Box, now: float) -> str:
    recent = sum(1 for t in box.swaps if t > now - WINDOW_S)
    if recent >= box.max_swaps_per_min:
        return f"{recent} swaps in the last minute (max_swaps_per_min {box.max_swaps_per_min})"
    return (
        f"swaps are spread {swap_spacing_s(box):g} s apart (max_swaps_per_min {box.max_swaps_per_min}); "
        f"{recent} in the last minute"
    )


def decide(box: Box, now: float) -> Action:
    """The next wake or start for the held requests, or how long to wait; NONE when none are held.

    Candidates are tried in order (priority, how many wait, how long): the first that may act acts,
    so a model on free GPUs is not held back by one waiting for a swap."""
    if box.busy is not None:
        return Action(Kind.WAIT, reason=f"{box.busy} holds the box: on-demand swaps wait for it")
    if box.running is not None:
        return Action(Kind.WAIT, box.running, reason=f"{box.running} is being brought up")
    candidates = sorted((m for m in box.models.values() if m.waiting and m.state is not State.SERVING), key=_order)
    if not candidates:
        return Action(Kind.NONE)
    waits: list[Action] = []
    for target in candidates:
        action = _try(box, target, now)
        if action.kind is not Kind.WAIT:
            return action
        waits.append(action)
    timed = [w for w in waits if w.until is not None]
    return min(timed, key=lambda w: w.until or 0.0) if timed else waits[0]


def _try(box: Box, target: ModelView, now: float) -> Action:
    kind = Kind.WAKE if target.state is State.ASLEEP else Kind.START
    displaced = box.displaced_by(target.name)
    if not displaced:
        return Action(
            kind, target.name, reason=f"{len(target.waiting)} request(s) wait; its GPUs are free", displaces=()
        )
    views = [box.models[d] for d in displaced]
    young = [v for v in views if v.since is not None and now < v.since + v.min_awake_s]
    if young:
        until = max((v.since or 0.0) + v.min_awake_s for v in young)
        return Action(
            Kind.WAIT,
            target.name,
            until,
            f"{', '.join(v.name for v in young)} must stay awake {young[0].min_awake_s:g} s (min_awake_s)",
        )
    heavier = _outweighed_by(box, target)
    if heavier is not None:
        return Action(Kind.WAIT, target.name, None, _outweighed(heavier, target))
    # Batching is for a displaced model someone is being served by right now (a reading since the held
    # requests came): a client alternating two models alone has nothing in flight when it asks for the
    # other, and waits for no bound. Who keeps the GPUs when one model is asked clearly more is decided
    # above on the recent peak (``asked``), which a closed-loop client's gap between requests cannot hide.
    active = [v for v in views if v.serving_now or v.waiting]
    stronger = [v for v in active if v.priority > target.priority]
    if stronger:
        return Action(
            Kind.WAIT,
            target.name,
            None,
            f"{stronger[0].name} (priority {stronger[0].priority}) still "
            f"has requests; {target.name} has priority {target.priority}",
        )
    if active:
        until = target.waiting[0] + box.batch_wait_s
        if now < until:
            return Action(
                Kind.WAIT,
                target.name,
                until,
                f"{active[0].name} still serves requests: {target.name}'s are batched (batch_wait_s)",
            )
    slot = next_swap_slot(box, now)
    if slot > now:
        return Action(Kind.WAIT, target.name, slot, _cap_reason(box, now))
    return Action(
        kind,
        target.name,
        reason=f"{len(target.waiting)} request(s) wait; {', '.join(displaced)} give(s) way",
        displaces=displaced,
    )


def _outweighed_by(box: Box, target: ModelView, extra: int = 0) -> ModelView | None:
    """A serving model on the target's GPUs, of equal priority, asked by clearly more requests right now
    than the target (with ``extra`` more): at least twice as many and 2 more. It keeps its GPUs, so the
    box serves what is asked most; two models asked about as much (clients alternating between them,
    one request apart) take turns."""
    wanted = len(target.waiting) + extra
    for name in box.displaced_by(target.name):
        v = box.models[name]
        if v.priority == target.priority and v.asked >= max(OUTWEIGH_FACTOR * wanted, wanted + OUTWEIGH_MARGIN):
            return v
    return None


def _outweighed(heavier: ModelView, target: ModelView, extra: int = 0) -> str:
    return (
        f"{heavier.name} is asked more ({heavier.asked} requests in flight or held, {target.name} "
        f"{len(target.waiting) + extra}): it keeps its GPUs"
    )


def retry_after(box: Box, name: str, now: float) -> int:
    """Seconds a turned-away client should wait: until the swap cap allows a swap, plus the batching
    bound; at least 1."""
    return max(1, math.ceil(next_swap_slot(box, now) - now + box.batch_wait_s))


def admit(box: Box, name: str, now: float) -> Reject | None:
    """Whether one more request for ``name`` (a model of the box) may be held: None, or why not."""
    m = box.models[name]
    if not m.on_demand and m.state is not State.SERVING:
        return Reject(
            503,
            f"model {name} is {m.state.value} and not on demand (on_demand = false): an operator "
            f"brings it up with `orchestrator switch {name}`",
        )
    heavier = _outweighed_by(box, m, extra=1) if m.state is not State.SERVING else None
    if heavier is not None:
        return Reject(429, _outweighed(heavier, m, extra=1), max(OUTWEIGHED_RETRY_S, retry_after(box, name, now)))
    if len(m.waiting) >= m.queue_limit:
        return Reject(
            429,
            f"{len(m.waiting)} requests for {name} already wait (queue_limit {m.queue_limit})",
            retry_after(box, name, now),
        )
    return None


def expired(box: Box, name: str, now: float, deadline_s: float) -> Reject:
    """The answer to a request for ``name`` held past its deadline: 503 when its model was being
    brought up (the engine was slow), else 429 (the policy held it back: the cap, min_awake_s, an
    operator's operation), with Retry-After."""
    if box.running == name:
        return Reject(
            503, f"{name} was not ready within {deadline_s:g} s (demand_deadline_s)", retry_after(box, name, now)
        )
    return Reject(
        429,
        f"{name} could not be brought up within {deadline_s:g} s (demand_deadline_s): "
        f"{decide(box, now).reason or 'the box is busy'}",
        retry_after(box, name, now),
    )


def idle(box: Box, now: float) -> tuple[Action, float | None]:
    """The first idle model to put to sleep or stop, and when the next one falls due (None: never).

    Idle time counts from the later of its last request and when it came up; a sleeper's from its
    ``last_request`` (which then includes when it last came up), not from when it fell asleep, which
    came ``idle_sleep_s`` after it (its ``since`` only when no request is known). A model with requests
    in flight or held is not idle; nothing happens while a swap or an operator's operation runs."""
    due: list[float] = []
    for m in sorted(box.models.values(), key=lambda v: v.name):
        if not m.on_demand or m.in_flight or m.waiting or m.state is State.STOPPED:
            continue
        if m.state is State.ASLEEP and m.last_request is not None:
            base = m.last_request
        else:
            base = max(t for t in (m.last_request, m.since, -math.inf) if t is not None)
        if base == -math.inf:
            continue
        if m.state is State.SERVING and m.sleeps and m.idle_sleep_s is not None:
            at = max(base + m.idle_sleep_s, (m.since or base) + m.min_awake_s)
            kind = Kind.SLEEP
            secs = m.idle_sleep_s
        elif m.idle_stop_s is not None:
            at = base + m.idle_stop_s
            if m.state is State.SERVING:
                at = max(at, (m.since or base) + m.min_awake_s)
            kind = Kind.STOP
            secs = m.idle_stop_s
        else:
            continue
        if at <= now:
            if box.busy is not None or box.running is not None:
                due.append(now)
                continue
            key = "idle_sleep_s" if kind is Kind.SLEEP else "idle_stop_s"
            return Action(kind, m.name, reason=f"no request for {now - base:.0f} s ({key} {secs:g})"), None
        due.append(at)
    return Action(Kind.NONE), (min(due) if due else None)
