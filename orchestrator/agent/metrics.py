"""Prometheus metrics on localhost: deployments by outcome, phase durations, active model, health."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from orchestrator import logs

log = logs.get_logger()


class Metrics:
    def __init__(self, port: int | None) -> None:
        self.port = port
        self.registry = CollectorRegistry()
        self.deployments = Counter(
            "orchestrator_deployments", "Deployments by host and outcome", ["host", "outcome"], registry=self.registry
        )
        self.phase_seconds = Histogram(
            "orchestrator_phase_seconds",
            "Duration of each deployment phase",
            ["phase"],
            registry=self.registry,
            buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 2400),
        )
        self.active_info = Gauge(
            "orchestrator_active_model_info",
            "1 for the model each host serves",
            ["host", "model", "revision"],
            registry=self.registry,
        )
        self.health = Gauge(
            "orchestrator_model_healthy",
            "1 when the serving model passes its health probe",
            ["host"],
            registry=self.registry,
        )
        self.loop_failures = Counter(
            "orchestrator_loop_failures",
            "Failed passes of the agent's loops (schedules, watch); the loop goes on",
            ["loop"],
            registry=self.registry,
        )
        self.loops_dead = Gauge(
            "orchestrator_loops_dead",
            "Agent loops that exited or stopped making progress (watchdog pings withheld)",
            registry=self.registry,
        )
        # Models on demand (agent/demand.py): how long held requests waited and how they ended, swaps, refusals.
        self.demand_waits = Histogram(
            "orchestrator_demand_wait_seconds",
            "How long a request held by the front "
            "proxy waited, by model and how it ended (ready, 429, 503, 404, cancelled)",
            ["model", "outcome"],
            registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900),
        )
        self.demand_swaps = Counter(
            "orchestrator_demand_swaps",
            "On-demand wakes and starts, by host, model, kind (wake, start) and whether they displaced a serving model",
            ["host", "model", "kind", "displacing"],
            registry=self.registry,
        )
        self.demand_refusals = Counter(
            "orchestrator_demand_rejected",
            "Held requests answered other than ready, by model and HTTP status (429: queue_limit or the swap cap)",
            ["model", "status"],
            registry=self.registry,
        )
        self.demand_queued = Gauge(
            "orchestrator_demand_queue", "Requests held now, by model", ["model"], registry=self.registry
        )
        # Warm switches: each model awake, asleep (at its level) or stopped, one series per state (1: now).
        self.residency_state = Gauge(
            "orchestrator_model_residency",
            "1 for the state each model is in on its host (awake, asleep at level 1 or 2, stopped), 0 for the others",
            ["host", "model", "state", "level"],
            registry=self.registry,
        )

    def start(self) -> None:
        if not self.port:
            return
        try:
            start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        except OSError as exc:  # metrics are an aid: a taken port must not stop the agent from switching
            log.warning("metrics_unavailable", port=self.port, error=str(exc))

    def deployment(self, host: str, outcome: str, phases: list[dict[str, Any]]) -> None:
        self.deployments.labels(host, outcome).inc()
        for p in phases:
            if p.get("seconds") is not None:
                self.phase_seconds.labels(p["phase"]).observe(float(p["seconds"]))

    def active(self, host: str, model: str | None, revision: int | None) -> None:
        for labels in list(self.active_info._metrics):  # one series per host: drop the old model's
            if labels[0] == host:
                self.active_info.remove(*labels)
        if model is not None:
            self.active_info.labels(host, model, str(revision)).set(1)

    def healthy(self, host: str, ok: bool) -> None:
        self.health.labels(host).set(1 if ok else 0)

    def loop_failure(self, loop: str) -> None:
        self.loop_failures.labels(loop).inc()

    def dead_loops(self, count: int) -> None:
        self.loops_dead.set(count)

    def demand_wait(self, model: str, outcome: str, seconds: float) -> None:
        self.demand_waits.labels(model, outcome).observe(max(0.0, seconds))

    def demand_swap(self, host: str, model: str, kind: str, *, displacing: bool) -> None:
        self.demand_swaps.labels(host, model, kind, "true" if displacing else "false").inc()

    def demand_rejected(self, model: str, status: int) -> None:
        self.demand_refusals.labels(model, str(status)).inc()

    def demand_queue(self, model: str, waiting: int) -> None:
        self.demand_queued.labels(model).set(waiting)

    def residency(self, host: str, series: list[tuple[str, str, str, int]]) -> None:
        """``host``'s models as core.resident.residency_series gives them; models gone from it drop out."""
        wanted = {(host, model, state, level): value for model, state, level, value in series}
        for labels in list(self.residency_state._metrics):  # set in place: a scrape never sees a gap
            if labels[0] == host and labels not in wanted:
                self.residency_state.remove(*labels)
        for labels, value in wanted.items():
            self.residency_state.labels(*labels).set(value)
