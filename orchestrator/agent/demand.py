"""The broker of models on demand: the agent's side of a request the front proxy holds.

Each held request is a ticket. The demand loop answers tickets whose model serves, turns away what
the policy refuses (core/demand.py: 429 with Retry-After, 404, 503) and runs the policy's next wake
or start as a normal switch through the agent's jobs (trigger ``demand:<model>``), warm where the
model sleeps, cold otherwise; a cold start whose every waiting request was cancelled is abandoned
(the switch fails on purpose and rolls back: the engine stopped, its GPUs verified free). The idle
loop puts models to sleep after ``idle_sleep_s`` and stops them after ``idle_stop_s``.
"""

from __future__ import annotations

import math
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator import logs
from orchestrator.agent.demand_ops import sleep_idle, stop_idle
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.server import Job, Jobs
from orchestrator.contract.wire import error_reply
from orchestrator.core import demand as policy
from orchestrator.core.catalog import Catalog
from orchestrator.core.demand import Box, Kind, ModelView, Reject
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.records import Deployment
from orchestrator.core.resident import ASLEEP, Residency, State
from orchestrator.deploy.operations import Operations
from orchestrator.errors import Busy, OrchestratorError
from orchestrator.ports import Clock

log = logs.get_logger()

TICK_S = 0.1  # the demand loop's pace while requests wait or a swap runs
IDLE_TICK_S = 1.0  # the idle loop's longest wait
SESSIONS_TTL_S = 0.25  # one `show stat` of the proxy serves the passes within this
RECORDS_TTL_S = 1.0  # the records are read again at least this often
ROUTED_S = 1.0  # requests just answered ready count as in flight this long (HAProxy counts them late)
PEAK_S = 1.5  # in flight: the most HAProxy counted over this long
BUSY_RETRY_S = 1.0  # a swap refused by the host's lock is tried again after this


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


@dataclass
class _Swap:
    """The on-demand switch running on a host."""

    model: str
    cold: bool
    started: float
    job: Job | None = None
    cancelled: int = 0  # its requests that went away meanwhile
    settled: bool = False  # its requests were answered from its result
    abandoned: bool = False  # given up: nobody waited any more


def _reply(reject: Reject) -> dict[str, Any]:
    return {"status": reject.status, "message": reject.message, "retry_after_s": reject.retry_after_s}


class Broker:
    def __init__(self, agent: BrokerAgent, clock: Clock) -> None:
        self.agent = agent
        self.clock = clock
        self.lock = threading.RLock()
        self.tickets: dict[str, list[Ticket]] = {}  # model -> its waiting tickets, oldest first
        self.swaps: dict[str, deque[float]] = {}  # host -> when its recent swaps began
        self.running: dict[str, _Swap] = {}  # host -> the on-demand switch running there
        self.idle_jobs: dict[str, Job] = {}  # host -> the idle sleep or stop running there
        self.last_request: dict[str, float] = {}  # model -> its last request (monotonic)
        self.yielding: dict[str, str] = {}  # host -> the operator's operation waiting for our job to end
        self.backoff: dict[str, tuple[float, str]] = {}  # host -> (until, why): its lock was held elsewhere
        self._ids = 0
        self._sessions: dict[str, tuple[float, dict[tuple[str, int], Sessions]]] = {}
        self._routed: dict[str, tuple[float, int]] = {}  # model -> (when, how many) last answered ready
        self._readings: dict[str, deque[tuple[float, int]]] = {}  # model -> (when, in flight) by HAProxy
        self._generation: dict[str, int] = {}  # host -> jobs started or ended there
        self._record_cache: dict[str, tuple[tuple[int, int], dict[str, Deployment], dict[str, Residency]]] = {}
        agent.jobs.observers.append(self._job_event)

    # -- the proxy's side -------------------------------------------------------------------------
    def open(self, name: str, stream: bool = False) -> Ticket:
        """A ticket for one held request for served name ``name``; answered at once when the name is
        unknown (404), its model serves (ready) or the policy turns it away."""
        now = self.clock.monotonic()
        catalog = self.agent.catalog
        model = next((m for m, spec in catalog.models.items() if spec.served == name), None)
        if model is not None:
            self.refresh(catalog.model_host(model).name, now)
        with self.lock:
            self._ids += 1
            if model is None:
                ticket = Ticket(self._ids, "", "", now, 0.0, stream)
                ticket.settle({"status": 404, "message": f"The model `{name}` does not exist.", "retry_after_s": None})
                self.agent.metrics.demand_rejected("(unknown)", 404)  # never the name: labels stay bounded
                return ticket
            host = catalog.model_host(model).name
            box = self._box(host, now, sessions=True)  # what is in flight decides "asked more"
            view = box.models[model]
            cold = view.state is State.STOPPED
            ticket = Ticket(self._ids, model, host, now, catalog.demand_deadline(model, cold=cold), stream,
                            limit_s=catalog.demand_deadline(model, cold=True))
            self.last_request[model] = now
            if _routable(box, model):
                self._answer(ticket, {"ready": True}, "ready")
                return ticket
            reject = policy.admit(box, model, now)
            if reject is not None:
                self._answer(ticket, _reply(reject), str(reject.status))
                return ticket
            self.tickets.setdefault(model, []).append(ticket)
            self.agent.metrics.demand_queue(model, len(self.tickets[model]))
            log.info("demand_held", model=model, ticket=ticket.id, queued=len(self.tickets[model]))
            return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The proxy closed its end: that request no longer waits."""
        with self.lock:
            queue = self.tickets.get(ticket.model, [])
            if ticket not in queue:
                return
            queue.remove(ticket)
            self.agent.metrics.demand_queue(ticket.model, len(queue))
            self.agent.metrics.demand_wait(ticket.model, "cancelled", self.clock.monotonic() - ticket.arrived)
            swap = self.running.get(ticket.host)
            if swap is not None and swap.model == ticket.model:
                swap.cancelled += 1

    def position(self, ticket: Ticket) -> int:
        """Its place in its model's queue (0: not queued); without the lock, so a connection's waiting
        lines never wait for a pass that holds it (the proxy takes 5 s of silence for a dead agent)."""
        try:
            return list(self.tickets.get(ticket.model, ())).index(ticket) + 1
        except ValueError:
            return 0

    # -- the loops ----------------------------------------------------------------------------------
    def tick(self) -> float:
        """One pass of the demand loop; returns the seconds to wait."""
        now = self.clock.monotonic()
        for host in self._hosts():
            if any(t.host == host for q in list(self.tickets.values()) for t in list(q)):
                self.refresh(host, now)
            with self.lock:
                self._finish_swap(host, now)
                if not any(t.host == host for q in self.tickets.values() for t in q):
                    continue
                box = self._box(host, now, sessions=True)
                self._answer_ready(box, now)
                action = policy.decide(box, now)
                if action.kind in (Kind.WAKE, Kind.START):
                    self._start(host, action, now)
        with self.lock:
            busy = bool(self.running) or any(self.tickets.values())
        return TICK_S if busy else 0.5

    def idle_tick(self) -> float:
        """One pass of the idle loop: the first idle model of each host goes to sleep or stops."""
        now = self.clock.monotonic()
        waits = [IDLE_TICK_S]
        for host in self._hosts():
            self.refresh(host, now)
            with self.lock:
                box = self._box(host, now, sessions=True)  # also a reading of what is in flight
                if not any(m.idle_sleep_s or m.idle_stop_s for n in self.agent.catalog.models_on(host)
                           for m in [self.agent.catalog.models[n]] if m.on_demand):
                    continue
                job = self.idle_jobs.get(host)
                if job is not None and not job.done.is_set():
                    continue
                self.idle_jobs.pop(host, None)
                action, due = policy.idle(box, now)
                if due is not None:
                    waits.append(max(0.05, due - now))
                if action.kind in (Kind.SLEEP, Kind.STOP) and action.model is not None:
                    self._idle(host, action)
        return min(waits)

    # -- what the loops do ------------------------------------------------------------------------
    def _start(self, host: str, action: policy.Action, now: float) -> None:
        model = action.model
        assert model is not None
        if self.agent.stopping.is_set():
            return  # the agent parks what runs; nothing new starts
        cold = action.kind is Kind.START
        swap = _Swap(model, cold, now)
        trigger = f"demand:{model}"

        def run(job: Job) -> dict[str, Any]:
            try:
                result = self.agent.ops.switch(model, trigger=trigger, progress=_publisher(job),
                                               abandon=(lambda: self._abandon(host, model)) if cold else None)
            except OrchestratorError as exc:
                with self.lock:
                    self._settle(host, swap, error_reply(exc))
                raise
            with self.lock:
                self._settle(host, swap, {"result": result})
            return result

        try:
            swap.job = self.agent.jobs.submit(host, "switch", {"model": model, "trigger": trigger}, run)
        except Busy:
            return  # someone else took the host between the look and the submit: the next pass waits
        self.running[host] = swap
        if action.swap:
            self.swaps.setdefault(host, deque(maxlen=1000)).append(now)
        self.agent.metrics.demand_swap(host, model, action.kind.value, displacing=action.swap)
        log.info("demand_swap", host=host, model=model, kind=action.kind.value, displaces=list(action.displaces),
                 reason=action.reason)

    def _abandon(self, host: str, model: str) -> str | None:
        with self.lock:
            swap = self.running.get(host)
            if swap is None or swap.model != model or self.tickets.get(model) or not swap.cancelled:
                return None
            swap.abandoned = True
            return (f"abandoned: every request waiting for {model} was cancelled ({swap.cancelled}) while it "
                    "cold-started")

    def _finish_swap(self, host: str, now: float) -> None:
        """The swap's job has ended: forget it (its requests were answered as it ended)."""
        swap = self.running.get(host)
        if swap is None or swap.job is None or not swap.job.done.is_set():
            return
        del self.running[host]
        if not swap.settled:  # it crashed outside the switch's own errors
            self._settle(host, swap, swap.job.result or {})

    def _settle(self, host: str, swap: _Swap, result: dict[str, Any]) -> None:
        """Answer the swap's requests from its result, in the job's own thread before it ends: an
        operator's switch waiting for it must not displace the model before they are routed."""
        now = self.clock.monotonic()
        swap.settled = True
        outcome = (result.get("result") or {}).get("outcome")
        waiting = self.tickets.pop(swap.model, [])
        self.agent.metrics.demand_queue(swap.model, 0)
        if outcome == "active":
            for t in waiting:
                self._answer(t, {"ready": True}, "ready")
            self._routed[swap.model] = (now, len(waiting))  # not yet in HAProxy's scur
        elif swap.abandoned and waiting:
            self.tickets[swap.model] = waiting  # they came after it was given up: the next pass decides
            self.agent.metrics.demand_queue(swap.model, len(waiting))
        elif isinstance(result.get("error"), dict) and result["error"].get("type") in ("Busy", "NodeInUse"):
            # the host's lock was taken (a CLI without the agent): its requests wait, the next try in a while
            self.tickets[swap.model] = waiting
            self.agent.metrics.demand_queue(swap.model, len(waiting))
            self.backoff[host] = (now + BUSY_RETRY_S, str(result["error"].get("message")))
            return
        else:
            error = result.get("error") or {}
            why = error.get("message") if isinstance(error, dict) else None
            message = f"{swap.model} could not be brought up ({outcome or 'failed'}): {why or 'see history'}"
            for t in waiting:
                self._answer(t, {"status": 503, "message": message, "retry_after_s": self.agent.catalog.proxy.retry_after_s},
                             "503")
        dep = (result.get("result") or {}).get("id")
        waits = sorted(round(now - t.arrived, 3) for t in waiting)
        self.agent.ops.record_event(self.clock.now(), host, "demand", {
            "deployment_id": dep, "model": swap.model, "outcome": outcome or "failed", "cold": swap.cold,
            "requests": len(waiting), "cancelled": swap.cancelled, "waits_s": waits[:100],
            "wait_max_s": waits[-1] if waits else None, "took_s": round(now - swap.started, 3)})

    def _answer_ready(self, box: Box, now: float) -> None:
        """Tickets whose model serves are routed; those held past their deadline are answered."""
        for model, queue in list(self.tickets.items()):
            if model not in box.models:
                continue
            if _routable(box, model):
                for t in queue:
                    self._answer(t, {"ready": True}, "ready")
                if queue:
                    self._routed[model] = (now, len(queue))
                queue.clear()
            coming = box.running == model
            for t in [t for t in queue if now - t.arrived >= (t.limit_s if coming else t.deadline_s)]:
                # while its own swap runs a request waits for it, up to the longest the proxy holds one
                queue.remove(t)
                limit = t.limit_s if coming else t.deadline_s
                self._answer(t, _reply(policy.expired(box, model, now, limit)), "expired")
            self.agent.metrics.demand_queue(model, len(queue))

    def _answer(self, ticket: Ticket, answer: dict[str, Any], outcome: str) -> None:
        ticket.settle(answer)
        if ticket.model:
            self.agent.metrics.demand_wait(ticket.model, outcome if outcome == "ready" else str(answer.get("status")),
                                           self.clock.monotonic() - ticket.arrived)
            if "status" in answer:
                self.agent.metrics.demand_rejected(ticket.model, int(answer["status"]))

    def _idle(self, host: str, action: policy.Action) -> None:
        model, kind = action.model, action.kind
        assert model is not None
        ops = self.agent.ops
        op = sleep_idle if kind is Kind.SLEEP else stop_idle

        def run(job: Job) -> dict[str, Any]:
            return op(ops, model, reason=action.reason, progress=_publisher(job))

        if self.agent.stopping.is_set():
            return
        try:
            self.idle_jobs[host] = self.agent.jobs.submit(host, f"demand_{kind.value}", {"model": model}, run)
        except Busy:
            return
        log.info("demand_idle", host=host, model=model, action=kind.value, reason=action.reason)

    # -- the policy's view of a host ------------------------------------------------------------------
    def _hosts(self) -> list[str]:
        cat = self.agent.catalog
        return sorted({cat.model_host(n).name for n, m in cat.models.items() if m.on_demand})

    def _records(self, host: str) -> tuple[dict[str, Deployment], dict[str, Residency]]:
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

    def refresh(self, host: str, now: float) -> None:
        """Read the proxy's sessions for ``host`` when the last reading is old; outside the lock (it
        runs a command on the host)."""
        cached = self._sessions.get(host)
        if cached is not None and now - cached[0] < SESSIONS_TTL_S:
            return
        serving, _ = self._records(host)
        proxy = self.agent.ops.ports_for(host).proxy
        engines = sorted({(d.spec.address, d.spec.port) for d in serving.values()})
        try:
            found = proxy.sessions(engines) if proxy is not None and engines else {}
        except OrchestratorError as exc:  # no figures (the master re-executing on a reload): the last ones
            log.info("demand_sessions_unknown", host=host, error=str(exc))
            found = cached[1] if cached is not None else {}
        self._sessions[host] = (now, found)

    def _box(self, host: str, now: float, *, sessions: bool = False) -> Box:
        cat = self.agent.catalog
        serving, records = self._records(host)
        epoch = self.clock.now()
        seen = self._sessions.get(host, (0.0, {}))[1] if sessions else {}
        views: dict[str, ModelView] = {}
        for name in cat.models_on(host):
            spec, rec, dep = cat.models[name], records.get(name), serving.get(name)
            state = State.SERVING if dep is not None else State.ASLEEP if rec is not None and rec.state == ASLEEP \
                else State.STOPPED
            began = rec.since if rec is not None and rec.state == state.value else \
                (dep.ended_at or dep.created_at) if dep is not None else None
            last = self.last_request.get(name)
            counted = seen.get((dep.spec.address, dep.spec.port)) if dep is not None else None
            if counted is not None and counted.idle_s is not None:
                last = max(last if last is not None else -math.inf, now - counted.idle_s)
            views[name] = ModelView(
                name=name, state=state, on_demand=spec.on_demand, sleeps=spec.sleep is not None,
                priority=spec.priority, min_awake_s=spec.min_awake_s, idle_sleep_s=spec.idle_sleep_s,
                idle_stop_s=spec.idle_stop_s, queue_limit=spec.queue_limit,
                since=None if began is None else now - max(0.0, epoch - began), last_request=last,
                in_flight=self._in_flight_now(name, counted.current if counted is not None else 0, now),
                waiting=tuple(t.arrived for t in self.tickets.get(name, [])))
        swap = self.running.get(host)
        return Box(models=views, conflicts=policy.conflicts_of(cat, host), swaps=tuple(self.swaps.get(host, ())),
                   busy=self._busy(host), running=swap.model if swap is not None else None,
                   max_swaps_per_min=cat.demand.max_swaps_per_min, batch_wait_s=cat.demand.batch_wait_s)

    def _busy(self, host: str) -> str | None:
        """What holds the host other than our own switch: an operator's (or the agent's) operation,
        or a tune run (its lock, held by the CLI that runs it, also between its switches)."""
        if host in self.yielding:
            return self.yielding[host]
        held = self.backoff.get(host)
        if held is not None and self.clock.monotonic() < held[0]:
            return held[1]
        locks = Path(self.agent.catalog.state_dir) / "locks"
        if lock_held(locks / f"{host}.tune.lock"):
            return f"a tune run on {host}"
        if lock_held(locks / f"{host}.bench.lock"):  # a bench reaches the engine directly: no session in HAProxy
            return f"a bench on {host}"
        job = self.agent.jobs.busy(host)
        swap = self.running.get(host)
        if job is None or (swap is not None and job is swap.job):
            return None
        what = " ".join(str(v) for v in job.args.values() if v not in (None, False, {}))
        return f"{job.op} {what}".strip()

    def _in_flight_now(self, model: str, current: int, now: float) -> int:
        """The most HAProxy counted over the last PEAK_S (closed-loop clients leave gaps between an
        answer and their next request), or the requests just answered ready when more (it counts them
        late)."""
        seen = self._readings.setdefault(model, deque(maxlen=256))
        if not seen or seen[-1] != (now, current):
            seen.append((now, current))
        while seen and seen[0][0] < now - PEAK_S:
            seen.popleft()
        peak = max(n for _, n in seen)
        when, n = self._routed.get(model, (0.0, 0))
        return max(peak, n) if now - when < ROUTED_S else peak

    def yield_to(self, host: str, what: str, timeout_s: float) -> None:
        """An operator's operation is about to start on ``host``: no on-demand swap starts from now on,
        and the one running (if any) is waited for, up to ``timeout_s``."""
        with self.lock:
            self.yielding[host] = what
            swap = self.running.get(host)
            idle_job = self.idle_jobs.get(host)
        for job in (swap.job if swap is not None else None, idle_job):
            if job is not None:
                job.done.wait(timeout_s)

    def resume(self, host: str) -> None:
        with self.lock:
            self.yielding.pop(host, None)

    def owns(self, job: Job | None) -> bool:
        with self.lock:
            return job is not None and (any(s.job is job for s in self.running.values())
                                        or any(j is job for j in self.idle_jobs.values()))

    # -- status -------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Per model: how many requests wait and the oldest's wait; per host: the swap running and
        the swaps in the last minute."""
        now = self.clock.monotonic()
        with self.lock:
            queues = {m: {"waiting": len(q), "oldest_s": round(now - q[0].arrived, 3) if q else None}
                      for m, q in self.tickets.items() if q}
            cat = self.agent.catalog
            hosts = {h: {"swapping": self.running[h].model if h in self.running else None,
                         "swaps_last_min": sum(1 for t in self.swaps.get(h, ()) if t > now - policy.WINDOW_S),
                         "yielding_to": self.yielding.get(h),
                         "busy": self._busy(h),  # what on-demand waits for (an operator, a tune, a bench)
                         "queues": {m: q for m, q in queues.items() if m in cat.models and m in cat.models_on(h)}}
                     for h in self._hosts()}
        return {"queues": queues, "hosts": hosts}


def _routable(box: Box, model: str) -> bool:
    """Whether a held request for ``model`` may go to its engine now: it serves and nothing runs on the
    box. The proxy asks only for a model its config does not route, and while a switch runs the records
    may still list one it is taking down (its engine then held the request asleep, until the proxy
    worker holding it was stopped)."""
    return box.models[model].state is State.SERVING and box.running is None and box.busy is None


def lock_held(path: Path) -> bool:
    """Whether a process holds a flock on ``path``, read from /proc/locks: probing with a flock of our
    own could make the holder's next non-blocking try fail for that instant."""
    try:
        st = os.stat(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return False
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(f[1:2] == ["FLOCK"] and f[5:6] == [where] for f in (line.split() for line in text.splitlines()))


def _publisher(job: Job) -> Callable[[str, dict[str, Any]], None]:
    return lambda event, fields: job.publish({"event": event, "fields": fields})
