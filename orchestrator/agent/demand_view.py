"""Models on demand, the policy's view of a host: what serves and sleeps there (the records, read
again after a job), what HAProxy counts in flight (its runtime API) and what holds the host (an
operator, a tune, a bench), as the Box core/demand.py decides on."""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Protocol

from orchestrator import logs
from orchestrator.agent.demand_tickets import Ticket, Waiting
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.server import Job, Jobs
from orchestrator.core import demand as policy
from orchestrator.core.catalog import Catalog
from orchestrator.core.demand import Box, ModelView
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.records import Deployment
from orchestrator.core.resident import ASLEEP, Residency, State
from orchestrator.deploy.locks import activity_holder
from orchestrator.deploy.operations import Operations
from orchestrator.errors import OrchestratorError
from orchestrator.ports import Clock

log = logs.get_logger()

SESSIONS_TTL_S = 0.25  # one `show stat` of the proxy serves the passes within this
RECORDS_TTL_S = 1.0  # the records are read again at least this often
ROUTED_S = 1.0  # requests just answered ready count as in flight this long (HAProxy counts them late)
# ... or, once the proxy took one (closed the demand connection after its answer), until a reading of
# HAProxy's taken this long after that: it counts the request at its engine by then (it assigns the
# server in the same pass that ends the hold)
TAKEN_S = 0.05
# asked: the most HAProxy counted over this long. A closed-loop client has no request in flight
# between an answer and its next request: a reading in that gap must not make a model with many
# clients look unasked to the rule that decides which model keeps the GPUs (core/demand.py outweighs).
PEAK_S = 1.5
SWAP_EVENT = "demand_swap"  # the event recorded as an on-demand swap begins: what the cap counts


class BrokerAgent(Protocol):
    """What the broker needs of the agent (agent/daemon.Agent)."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def ops(self) -> Operations: ...

    @property
    def jobs(self) -> Jobs: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def stopping(self) -> threading.Event: ...


class HostView:
    """Builds each host's Box from the records, HAProxy's sessions and ``waiting``; caches both reads."""

    def __init__(self, agent: BrokerAgent, clock: Clock, waiting: Waiting) -> None:
        self.agent = agent
        self.clock = clock
        self.waiting = waiting
        self._sessions: dict[str, tuple[float, dict[tuple[str, int], Sessions]]] = {}
        self._routed: dict[str, tuple[float, int]] = {}  # model -> (when, how many) last answered ready
        self._released: dict[str, list[Ticket]] = {}  # model -> tickets answered ready, until HAProxy counts them
        # model -> (since when, in flight) as HAProxy counted it: one entry per change of the count, not per
        # pass, so PEAK_S is a span of time however many passes read the box (a flood of turned-away requests
        # reads it hundreds of times a second)
        self._readings: dict[str, deque[tuple[float, int]]] = {}
        self._generation: dict[str, int] = {}  # host -> jobs started or ended there
        self._record_cache: dict[str, tuple[tuple[int, int], dict[str, Deployment], dict[str, Residency]]] = {}
        agent.jobs.observers.append(self._job_event)

    def hosts(self) -> list[str]:
        cat = self.agent.catalog
        return sorted({cat.model_host(n).name for n, m in cat.models.items() if m.on_demand})

    def routed(self, model: str, now: float, tickets: list[Ticket]) -> None:
        """``tickets`` for ``model`` were just answered ready (not yet in HAProxy's scur)."""
        when, count = self._routed.get(model, (-math.inf, 0))
        self._routed[model] = (now, (count if now - when < ROUTED_S else 0) + len(tickets))  # those of the last second
        self._released.setdefault(model, []).extend(tickets)

    def records(self, host: str) -> tuple[dict[str, Deployment], dict[str, Residency]]:
        """What serves and sleeps on ``host`` by the records: read again after a job started or ended
        there, and at least each RECORDS_TTL_S (a CLI run without the agent changes them too), so a
        flood of held requests does not read the store for each one."""
        generation = self._generation.get(host, 0)
        cached = self._record_cache.get(host)
        if cached is not None and cached[0] == (generation, int(self.clock.monotonic() / RECORDS_TTL_S)):
            return cached[1], cached[2]
        cat, ops = self.agent.catalog, self.agent.ops
        serving = {d.model: d for d in ops.store.serving_set(host)}
        records = ops.residency.residency(host) if any(cat.models[n].sleep for n in cat.models_on(host)) else {}
        if self.agent.jobs.busy(host) is None:  # a running job may change them at any moment
            self._record_cache[host] = ((generation, int(self.clock.monotonic() / RECORDS_TTL_S)), serving, records)
        return serving, records

    def _job_event(self, what: str, job: Job) -> None:
        """Jobs' observer: a job started or ended on a host, its records may have changed."""
        self._generation[job.host] = self._generation.get(job.host, 0) + 1

    def refresh(self, host: str, now: float, after: float | None = None) -> None:
        """Read the proxy's sessions for ``host`` when the last reading is old, or was taken before
        ``after``; outside the lock (it runs a command on the host)."""
        cached = self._sessions.get(host)
        if cached is not None and now - cached[0] < SESSIONS_TTL_S and (after is None or cached[0] >= after):
            return
        now = self.clock.monotonic()  # the reading's own time: what it can tell comes after this
        serving, _ = self.records(host)
        proxy = self.agent.ops.ports_for(host).proxy
        engines = sorted({(d.spec.address, d.spec.port) for d in serving.values()})
        try:
            found = proxy.sessions(engines) if proxy is not None and engines else {}
        except OrchestratorError as exc:  # no figures (the master re-executing on a reload): the last ones
            log.info("demand_sessions_unknown", host=host, error=str(exc))
            found = cached[1] if cached is not None else {}
        self._sessions[host] = (now, found)

    def box(self, host: str, now: float, *, sessions: bool = False) -> Box:
        cat, w = self.agent.catalog, self.waiting
        serving, records = self.records(host)
        epoch = self.clock.now()
        read_at, seen = self._sessions.get(host, (-math.inf, {})) if sessions else (-math.inf, {})
        held = [t.arrived for n in cat.models_on(host) for t in w.tickets.get(n, [])]
        fresh = sessions and bool(held) and read_at >= min(held)  # read after the oldest held request came
        views: dict[str, ModelView] = {}
        for name in cat.models_on(host):
            spec, rec, dep = cat.models[name], records.get(name), serving.get(name)
            state = (
                State.SERVING
                if dep is not None
                else State.ASLEEP
                if rec is not None and rec.state == ASLEEP
                else State.STOPPED
            )
            began = (
                rec.since
                if rec is not None and rec.state == state.value
                else (dep.ended_at or dep.created_at)
                if dep is not None
                else None
            )
            last = w.last_request.get(name)
            counted = seen.get((dep.spec.address, dep.spec.port)) if dep is not None else None
            if counted is not None and counted.idle_s is not None:
                last = max(last if last is not None else -math.inf, now - counted.idle_s)
            up = None if began is None else now - max(0.0, epoch - began)
            known = [t for t in (last, up) if t is not None]
            if state is State.SERVING and known:
                w.idle_from[name] = max(known)
            elif state is State.ASLEEP and name in w.idle_from:
                last = max(w.idle_from[name], last if last is not None else -math.inf)
            views[name] = ModelView(
                name=name,
                state=state,
                on_demand=spec.on_demand,
                sleeps=spec.sleep is not None,
                priority=spec.priority,
                min_awake_s=spec.min_awake_s,
                idle_sleep_s=spec.idle_sleep_s,
                idle_stop_s=spec.idle_stop_s,
                queue_limit=spec.queue_limit,
                since=up,
                last_request=last,
                in_flight=self._in_flight_now(name, counted.current if counted is not None else 0, now),
                current=self._current(name, counted.current if counted is not None else 0, read_at) if fresh else None,
                waiting=tuple(t.arrived for t in w.tickets.get(name, [])),
            )
        swap = w.running.get(host)
        return Box(
            models=views,
            conflicts=policy.conflicts_of(cat, host),
            swaps=tuple(self.swaps(host)),
            busy=self.busy(host),
            running=swap.model if swap is not None else None,
            max_swaps_per_min=cat.demand.max_swaps_per_min,
            batch_wait_s=cat.demand.batch_wait_s,
        )

    def swaps(self, host: str) -> deque[float]:
        """When ``host``'s recent swaps began (monotonic); read first from the records of the swaps
        (SWAP_EVENT), so a restarted agent keeps the cap its previous run counted."""
        w = self.waiting
        if host not in w.swaps:
            limit = self.agent.catalog.demand.max_swaps_per_min
            at = [float(e["at"]) for e in self.agent.ops.store.events(host=host, kind=SWAP_EVENT, limit=limit)]
            w.swaps[host] = deque(policy.recorded_swaps(at, self.clock.now(), self.clock.monotonic()), maxlen=1000)
        return w.swaps[host]

    def busy(self, host: str) -> str | None:
        """What holds the host other than our own switch: an operator's (or the agent's) operation,
        or a tune run (its lock, held by the CLI that runs it, also between its switches)."""
        w = self.waiting
        if host in w.yielding:
            return w.yielding[host]
        held = w.backoff.get(host)
        if held is not None and self.clock.monotonic() < held[0]:
            return held[1]
        for activity in ("tune", "bench"):  # a bench reaches the engine directly: no session in HAProxy
            if (doing := activity_holder(self.agent.catalog.state_dir, host, activity)) is not None:
                return doing
        job = self.agent.jobs.busy(host)
        swap = w.running.get(host)
        if job is None or (swap is not None and job is swap.job):
            return None
        what = " ".join(str(v) for v in job.args.values() if v not in (None, False, {}))
        return f"{job.op} {what}".strip()

    def _in_flight_now(self, model: str, current: int, now: float) -> int:
        """The most HAProxy counted over the last PEAK_S (closed-loop clients leave gaps between an
        answer and their next request), or the requests just answered ready when more (it counts them
        late)."""
        seen = self._readings.setdefault(model, deque())
        if not seen or seen[-1][1] != current:
            seen.append((now, current))
        # The count in effect when the span began stays: one is dropped once the next began before it.
        while len(seen) > 1 and seen[1][0] <= now - PEAK_S:
            seen.popleft()
        peak = max(n for _, n in seen)
        when, n = self._routed.get(model, (0.0, 0))
        return max(peak, n) if now - when < ROUTED_S else peak

    def _current(self, model: str, counted: int, read_at: float) -> int:
        """In flight by the reading taken at ``read_at``: what HAProxy counted, and the requests answered
        ready that it may not count yet (not taken by the proxy within ROUTED_S of their answer, or taken
        less than TAKEN_S before the reading)."""
        unsure = []
        for t in self._released.get(model, []):
            answered = t.answered_at if t.answered_at is not None else -math.inf
            if (t.taken_at is None and read_at - answered < ROUTED_S) or (
                t.taken_at is not None and read_at < t.taken_at + TAKEN_S
            ):
                unsure.append(t)
        self._released[model] = unsure
        return counted + len(unsure)


def routable(box: Box, model: str) -> bool:
    """Whether a held request for ``model`` may go to its engine now: it serves and nothing runs on the
    box. The proxy asks only for a model its config does not route, and while a switch runs the records
    may still list one it is taking down (its engine then held the request asleep, until the proxy
    worker holding it was stopped)."""
    return box.models[model].state is State.SERVING and box.running is None and box.busy is None
