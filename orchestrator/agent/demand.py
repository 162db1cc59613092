"""The broker of models on demand: the agent's side of a request the front proxy holds.

Each held request is a ticket (agent/demand_tickets.py). The demand loop answers tickets whose model
serves, turns away what the policy refuses (core/demand.py: 429 with Retry-After, 404, 503) and runs
the policy's next wake or start as a normal switch through the agent's jobs (agent/demand_jobs.py:
trigger ``demand:<model>``), warm where the model sleeps, cold otherwise; a cold start whose every
waiting request was cancelled is abandoned (the switch fails on purpose and rolls back: the engine
stopped, its GPUs verified free). The idle loop puts models to sleep after ``idle_sleep_s`` and stops
them after ``idle_stop_s``. What the policy sees of a host: agent/demand_view.py.
"""

from __future__ import annotations

import threading
from typing import Any

from orchestrator import logs
from orchestrator.agent.demand_jobs import DemandJobs
from orchestrator.agent.demand_tickets import Swap, Ticket, Waiting, reply
from orchestrator.agent.demand_view import BrokerAgent, HostView, routable
from orchestrator.agent.server import Job
from orchestrator.core import demand as policy
from orchestrator.core.demand import Box, Kind
from orchestrator.core.resident import State
from orchestrator.ports import Clock

log = logs.get_logger()

TICK_S = 0.1  # the demand loop's pace while requests wait or a swap runs
MIN_TICK_S = 0.005  # its shortest wait, up to the end of a bound (batch_wait_s, the swap cap)
IDLE_TICK_S = 1.0  # the idle loop's longest wait


class Broker:
    def __init__(self, agent: BrokerAgent, clock: Clock) -> None:
        self.agent = agent
        self.clock = clock
        self.waiting = Waiting()
        self.lock = self.waiting.lock
        self.view = HostView(agent, clock, self.waiting)
        self.jobs = DemandJobs(agent, clock, self.waiting, self.view)
        self._ids = 0
        # set when a request is held or a job ends: the demand loop's next pass runs at once
        self.wake = threading.Event()
        agent.jobs.observers.append(lambda what, job: self.wake.set() if what == "finished" else None)

    @property
    def running(self) -> dict[str, Swap]:
        """host -> the on-demand switch running there."""
        return self.waiting.running

    @property
    def idle_jobs(self) -> dict[str, Job]:
        """host -> the idle sleep or stop running there."""
        return self.waiting.idle_jobs

    # -- the proxy's side -------------------------------------------------------------------------
    def open(self, name: str, stream: bool = False) -> Ticket:
        """A ticket for one held request for served name ``name``; answered at once when the name is
        unknown (404), its model serves (ready) or the policy turns it away."""
        now = self.clock.monotonic()
        catalog = self.agent.catalog
        model = next((m for m, spec in catalog.models.items() if spec.served == name), None)
        if model is not None:
            self.view.refresh(catalog.model_host(model).name, now)
        w = self.waiting
        with self.lock:
            self._ids += 1
            if model is None:
                ticket = Ticket(self._ids, "", "", now, 0.0, stream)
                ticket.settle({"status": 404, "message": f"The model `{name}` does not exist.", "retry_after_s": None})
                self.agent.metrics.demand_rejected("(unknown)", 404)  # never the name: labels stay bounded
                return ticket
            host = catalog.model_host(model).name
            box = self.view.box(host, now, sessions=True)  # what is in flight decides "asked more"
            view = box.models[model]
            cold = view.state is State.STOPPED
            ticket = Ticket(
                self._ids,
                model,
                host,
                now,
                catalog.demand_deadline(model, cold=cold),
                stream,
                limit_s=catalog.demand_deadline(model, cold=True),
            )
            w.last_request[model] = now
            if routable(box, model) or self.jobs.released(host, model):
                self.jobs.answer(ticket, {"ready": True}, "ready")
                self.view.routed(model, now, [ticket])
                return ticket
            reject = policy.admit(box, model, now)
            if reject is not None:
                self.jobs.answer(ticket, reply(reject), str(reject.status))
                return ticket
            w.tickets.setdefault(model, []).append(ticket)
            self.agent.metrics.demand_queue(model, len(w.tickets[model]))
            log.info("demand_held", model=model, ticket=ticket.id, queued=len(w.tickets[model]))
            self.wake.set()
            return ticket

    def cancel(self, ticket: Ticket) -> None:
        """The proxy closed its end: that request no longer waits."""
        w = self.waiting
        with self.lock:
            queue = w.tickets.get(ticket.model, [])
            if ticket not in queue:
                return
            queue.remove(ticket)
            self.agent.metrics.demand_queue(ticket.model, len(queue))
            self.agent.metrics.demand_wait(ticket.model, "cancelled", self.clock.monotonic() - ticket.arrived)
            swap = w.running.get(ticket.host)
            if swap is not None and swap.model == ticket.model:
                swap.cancelled += 1

    def taken(self, ticket: Ticket) -> None:
        """The proxy took ``ticket``'s ready answer (it closed its end): HAProxy counts the request from now."""
        ticket.taken_at = self.clock.monotonic()

    def position(self, ticket: Ticket) -> int:
        """Its place in its model's queue (0: not queued); without the lock, so a connection's waiting
        lines never wait for a pass that holds it (the proxy takes 5 s of silence for a dead agent)."""
        try:
            return list(self.waiting.tickets.get(ticket.model, ())).index(ticket) + 1
        except ValueError:
            return 0

    # -- the loops ----------------------------------------------------------------------------------
    def tick(self) -> float:
        """One pass of the demand loop; returns the seconds to wait."""
        now = self.clock.monotonic()
        w = self.waiting
        wait = TICK_S
        for host in self.view.hosts():
            if w.waits_on(host):  # a reading since the oldest held request came: what is in flight now
                self.view.refresh(host, now, after=w.oldest(host))
            with self.lock:
                self.jobs.finish(host, now)
                if not any(t.host == host for q in w.tickets.values() for t in q):
                    continue
                box = self.view.box(host, now, sessions=True)
                self._answer_ready(host, box, now)
                action = policy.decide(box, now)
                if action.kind in (Kind.WAKE, Kind.START):
                    self.jobs.start(host, action, now)
                elif action.until is not None:  # the batching bound or the swap cap ends then: be there
                    wait = min(wait, max(MIN_TICK_S, action.until - now))
        with self.lock:
            busy = bool(w.running) or any(w.tickets.values())
        return wait if busy else 0.5

    def idle_tick(self) -> float:
        """One pass of the idle loop: the first idle model of each host goes to sleep or stops."""
        now = self.clock.monotonic()
        waits = [IDLE_TICK_S]
        for host in self.view.hosts():
            self.view.refresh(host, now)
            with self.lock:
                box = self.view.box(host, now, sessions=True)  # also a reading of what is in flight
                if not any(
                    m.idle_sleep_s or m.idle_stop_s
                    for n in self.agent.catalog.models_on(host)
                    for m in [self.agent.catalog.models[n]]
                    if m.on_demand
                ):
                    continue
                job = self.waiting.idle_jobs.get(host)
                if job is not None and not job.done.is_set():
                    continue
                self.waiting.idle_jobs.pop(host, None)
                action, due = policy.idle(box, now)
                if due is not None:
                    waits.append(max(0.05, due - now))
                if action.kind in (Kind.SLEEP, Kind.STOP) and action.model is not None:
                    self.jobs.idle(host, action)
        return min(waits)

    def _answer_ready(self, host: str, box: Box, now: float) -> None:
        """Tickets whose model serves are routed; those held past their deadline are answered."""
        for model, queue in list(self.waiting.tickets.items()):
            if model not in box.models:
                continue
            if routable(box, model) or self.jobs.released(host, model):
                for t in queue:
                    self.jobs.answer(t, {"ready": True}, "ready")
                if queue:
                    self.view.routed(model, now, list(queue))
                queue.clear()
            coming = box.running == model
            for t in [t for t in queue if now - t.arrived >= (t.limit_s if coming else t.deadline_s)]:
                # while its own swap runs a request waits for it, up to the longest the proxy holds one
                queue.remove(t)
                limit = t.limit_s if coming else t.deadline_s
                self.jobs.answer(t, reply(policy.expired(box, model, now, limit)), "expired")
            self.agent.metrics.demand_queue(model, len(queue))

    def release(self, why: str) -> None:
        """The loops stop (``why``): every request still held gets a 503 now, none waits for a pass
        that will not come."""
        retry = self.agent.catalog.proxy.retry_after_s
        with self.lock:
            for model, queue in list(self.waiting.tickets.items()):
                for t in queue:
                    self.jobs.answer(
                        t,
                        {
                            "status": 503,
                            "message": f"{model} is not brought up on demand: {why}",
                            "retry_after_s": retry,
                        },
                        "503",
                    )
                queue.clear()
                self.agent.metrics.demand_queue(model, 0)

    # -- operators first ----------------------------------------------------------------------------
    def yield_to(self, host: str, what: str, timeout_s: float) -> None:
        """An operator's operation is about to start on ``host``: no on-demand swap starts from now on,
        and the one running (if any) is waited for, up to ``timeout_s``."""
        w = self.waiting
        with self.lock:
            w.yielding[host] = what
            swap = w.running.get(host)
            idle_job = w.idle_jobs.get(host)
        for job in (swap.job if swap is not None else None, idle_job):
            if job is not None:
                job.done.wait(timeout_s)

    def resume(self, host: str) -> None:
        with self.lock:
            self.waiting.yielding.pop(host, None)

    def owns(self, job: Job | None) -> bool:
        w = self.waiting
        with self.lock:
            return job is not None and (
                any(s.job is job for s in w.running.values()) or any(j is job for j in w.idle_jobs.values())
            )

    # -- status -------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Per model: how many requests wait and the oldest's wait; per host: the swap running and
        the swaps in the last minute."""
        now = self.clock.monotonic()
        w = self.waiting
        with self.lock:
            queues = {
                m: {"waiting": len(q), "oldest_s": round(now - q[0].arrived, 3) if q else None}
                for m, q in w.tickets.items()
                if q
            }
            cat = self.agent.catalog
            hosts = {
                h: {
                    "swapping": w.running[h].model if h in w.running else None,
                    "swaps_last_min": sum(1 for t in self.view.swaps(h) if t > now - policy.WINDOW_S),
                    "yielding_to": w.yielding.get(h),
                    "busy": self.view.busy(h),  # what on-demand waits for (an operator, a tune, a bench)
                    "queues": {m: q for m, q in queues.items() if m in cat.models and m in cat.models_on(h)},
                }
                for h in self.view.hosts()
            }
        return {"queues": queues, "hosts": hosts}


__all__ = ["Broker", "BrokerAgent", "Ticket"]
