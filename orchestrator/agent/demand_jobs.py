"""Models on demand, the jobs the broker runs: a wake or start as a normal switch through the agent's
jobs (trigger ``demand:<model>``), whose result answers the requests waiting for it, and the idle
sleep or stop (the table's demand_sleep and demand_stop: contract/ops.py, deploy/demand_ops.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator import logs
from orchestrator.agent.demand_tickets import Swap, Ticket, Waiting, answer
from orchestrator.agent.demand_view import SWAP_EVENT, BrokerAgent, HostView
from orchestrator.agent.server import Job
from orchestrator.contract.ops import DEMAND_SLEEP, DEMAND_STOP
from orchestrator.contract.sides import Caller
from orchestrator.contract.wire import error_of, error_reply
from orchestrator.core import demand as policy
from orchestrator.core.demand import Kind
from orchestrator.core.records import SwitchResult
from orchestrator.core.states import Phase
from orchestrator.errors import Busy, OrchestratorError
from orchestrator.ports import Clock

log = logs.get_logger()

BUSY_RETRY_S = 1.0  # a swap refused by the host's lock is tried again after this


class DemandJobs:
    """Starts the policy's swaps and idle actions as jobs and settles their requests when they end."""

    def __init__(self, agent: BrokerAgent, clock: Clock, waiting: Waiting, view: HostView) -> None:
        self.agent = agent
        self.clock = clock
        self.waiting = waiting
        self.view = view

    def answer(self, ticket: Ticket, reply: dict[str, Any], outcome: str) -> None:
        answer(ticket, reply, outcome, self.agent.metrics, self.clock.monotonic())

    def start(self, host: str, action: policy.Action, now: float) -> None:
        model = action.model
        assert model is not None
        if self.agent.stopping.is_set():
            return  # the agent parks what runs; nothing new starts
        cold = action.kind is Kind.START
        swap = Swap(model, cold, now)
        trigger = f"demand:{model}"
        w = self.waiting
        swap.arrived = min((t.arrived for t in w.tickets.get(model, [])), default=None)
        if swap.arrived is not None:
            swap.mark(swap.arrived, "arrival")
        swap.mark(now, "decided")

        def run(job: Job) -> dict[str, Any]:
            publish = _publisher(job)

            def progress(event: str, fields: dict[str, Any]) -> None:
                publish(event, fields)
                if event not in QUIET:
                    swap.mark(self.clock.monotonic(), _what(event, fields))
                if event == "phase" and fields.get("model") == model:
                    self._phase(host, swap, str(fields.get("phase")))

            try:
                result = self.agent.ops.switch(
                    model,
                    trigger=trigger,
                    progress=progress,
                    abandon=(lambda: self._abandon(host, model)) if cold else None,
                )
            except OrchestratorError as exc:
                with w.lock:
                    self.settle(host, swap, error_reply(exc))
                raise
            with w.lock:
                self.settle(host, swap, {"result": result})
            return result

        try:
            swap.job = self.agent.jobs.submit(host, "switch", {"model": model, "trigger": trigger}, run)
        except Busy:
            return  # someone else took the host between the look and the submit: the next pass waits
        w.running[host] = swap
        if action.swap:
            self.view.swaps(host).append(now)
            self.agent.ops.record_event(
                self.clock.now(),
                host,
                SWAP_EVENT,
                {"model": model, "action": action.kind.value, "displaces": list(action.displaces)},
            )
        self.agent.metrics.demand_swap(host, model, action.kind.value, displacing=action.swap)
        log.info(
            "demand_swap",
            host=host,
            model=model,
            kind=action.kind.value,
            displaces=list(action.displaces),
            reason=action.reason,
        )

    def _phase(self, host: str, swap: Swap, phase: str) -> None:
        """The swap's switch entered ``phase``: at `routing` its target has been checked awake (a real
        completion: waking's, or checking's), so the requests held for it go now, not after the
        proxy's reload and the switch's end; a rollback after that holds the later ones again."""
        with self.waiting.lock:
            if phase == Phase.ROUTING.value:
                swap.released = True
                self.release(swap, self.clock.monotonic())
            elif phase == Phase.ROLLING_BACK.value:
                swap.released = False

    def release(self, swap: Swap, now: float) -> None:
        """Answer ready every request waiting for ``swap``'s model (its target serves)."""
        queue = self.waiting.tickets.get(swap.model, [])
        if not queue:
            return
        for t in queue:
            self.answer(t, {"ready": True}, "ready")
        swap.mark(now, f"released {len(queue)}")
        self.view.routed(swap.model, now, list(queue))
        swap.waits.extend(now - t.arrived for t in queue)
        queue.clear()
        self.agent.metrics.demand_queue(swap.model, 0)

    def released(self, host: str, model: str) -> bool:
        """Whether requests for ``model`` go to its engine now because its swap released them."""
        swap = self.waiting.running.get(host)
        return swap is not None and swap.model == model and swap.released

    def _abandon(self, host: str, model: str) -> str | None:
        w = self.waiting
        with w.lock:
            swap = w.running.get(host)
            if swap is None or swap.model != model or w.tickets.get(model) or not swap.cancelled:
                return None
            swap.abandoned = True
            return (
                f"abandoned: every request waiting for {model} was cancelled ({swap.cancelled}) while it cold-started"
            )

    def finish(self, host: str, now: float) -> None:
        """The swap's job has ended: forget it (its requests were answered as it ended)."""
        w = self.waiting
        swap = w.running.get(host)
        if swap is None or swap.job is None or not swap.job.done.is_set():
            return
        del w.running[host]
        if not swap.settled:  # it crashed outside the switch's own errors
            self.settle(host, swap, swap.job.result or {})

    def settle(self, host: str, swap: Swap, result: dict[str, Any]) -> None:
        """Answer the swap's requests from its result, in the job's own thread before it ends: an
        operator's switch waiting for it must not displace the model before they are routed."""
        now = self.clock.monotonic()
        w = self.waiting
        swap.settled = True
        swap.mark(now, "settled")
        switched = SwitchResult.from_dict(result.get("result") or {})
        outcome = switched.ended
        waiting = w.tickets.pop(swap.model, [])
        self.agent.metrics.demand_queue(swap.model, 0)
        if switched.outcome is Phase.ACTIVE:
            for t in waiting:
                self.answer(t, {"ready": True}, "ready")
            if waiting:
                self.view.routed(swap.model, now, waiting)  # not yet in HAProxy's scur
        elif swap.abandoned and waiting:
            w.tickets[swap.model] = waiting  # they came after it was given up: the next pass decides
            self.agent.metrics.demand_queue(swap.model, len(waiting))
        elif isinstance(result.get("error"), dict) and isinstance(error_of(result["error"]), Busy):
            # the host's lock was taken (a CLI without the agent): its requests wait, the next try in a while
            w.tickets[swap.model] = waiting
            self.agent.metrics.demand_queue(swap.model, len(waiting))
            w.backoff[host] = (now + BUSY_RETRY_S, str(result["error"].get("message")))
            return
        else:
            error = result.get("error") or {}
            why = error.get("message") if isinstance(error, dict) else None
            message = f"{swap.model} could not be brought up ({outcome}): {why or 'see history'}"
            for t in waiting:
                self.answer(
                    t,
                    {"status": 503, "message": message, "retry_after_s": self.agent.catalog.proxy.retry_after_s},
                    "503",
                )
        dep = switched.deployment_id
        waits = sorted(round(w, 3) for w in [*swap.waits, *(now - t.arrived for t in waiting)])
        self.agent.ops.record_event(
            self.clock.now(),
            host,
            "demand",
            {
                "deployment_id": dep,
                "model": swap.model,
                "outcome": outcome,
                "cold": swap.cold,
                "requests": len(waits),
                "cancelled": swap.cancelled,
                "waits_s": waits[:100],
                "wait_max_s": waits[-1] if waits else None,
                "took_s": round(now - swap.started, 3),
                "timeline_ms": swap.timeline_ms(),
            },
        )

    def idle(self, host: str, action: policy.Action) -> None:
        """Start the policy's idle sleep or stop of a model as a job: the table's demand_sleep or
        demand_stop (contract/ops.py), parsed and run as a client's request is."""
        model, kind = action.model, action.kind
        assert model is not None
        ops = self.agent.ops
        spec = DEMAND_SLEEP if kind is Kind.SLEEP else DEMAND_STOP
        args = spec.parse(ops.catalog, {"model": model, "reason": action.reason})

        def run(job: Job) -> dict[str, Any]:
            return spec.in_process(ops, args, Caller(progress=_publisher(job), trigger=f"demand:{model}"))

        if self.agent.stopping.is_set():
            return
        try:
            self.waiting.idle_jobs[host] = self.agent.jobs.submit(host, spec.name, {"model": model}, run)
        except Busy:
            return
        log.info("demand_idle", host=host, model=model, action=kind.value, reason=action.reason)


QUIET = frozenset({"waiting", "stage_progress"})  # progress lines a swap's timeline leaves out (many, no step)


def _what(event: str, fields: dict[str, Any]) -> str:
    """One progress event as a timeline mark: the event, the phase it enters, and what it is about."""
    if event == "phase":
        return f"phase {fields.get('phase')}"
    about = fields.get("model") or fields.get("unit")
    changed = fields.get("changed")
    return " ".join(str(x) for x in (event, about, "(reloaded)" if changed is True else None) if x)


def _publisher(job: Job) -> Callable[[str, dict[str, Any]], None]:
    return lambda event, fields: job.publish({"event": event, "fields": fields})
