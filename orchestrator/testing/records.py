"""A host's records: deployments, what serves, events (StateStore) and residency."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from orchestrator.core.records import NO_CHANGE, Deployment, PhaseTiming, ServingChange, UnitSpec
from orchestrator.core.resident import SERVING, STATES, Residency
from orchestrator.core.states import Fallback, Phase, fallback_of, is_terminal
from orchestrator.errors import StateError


class FakeStateStore:
    """The StateStore port in memory, with the SQLite store's semantics (tests/unit/test_state_store.py
    runs one contract against both): revisions count per host, timings come from transitions."""

    def __init__(self) -> None:
        self.rows: dict[int, Deployment] = {}
        self.marks: dict[int, list[tuple[str, float]]] = {}
        self.pointers: dict[str, int | None] = {}
        self.sets: dict[str, list[int]] = {}
        self.plans: dict[int, dict[str, Any]] = {}
        self.log: list[dict[str, Any]] = []

    def _put(self, dep_id: int, **changes: Any) -> None:
        self.rows[dep_id] = replace(self.rows[dep_id], **changes)

    def create(
        self,
        host: str,
        spec: UnitSpec,
        trigger: str,
        previous_revision: int | None,
        at: float,
        no_rollback: bool = False,
        *,
        restores: int | None = None,
        fallback: Fallback | None = None,
        plan: dict[str, Any] | None = None,
    ) -> Deployment:
        dep_id = len(self.rows) + 1
        revision = 1 + max((d.revision for d in self.rows.values() if d.host == host), default=0)
        if fallback is None:
            fallback = fallback_of(previous_revision=previous_revision, in_set=False, no_rollback=no_rollback)
        self.rows[dep_id] = Deployment(
            id=dep_id,
            host=host,
            revision=revision,
            spec=spec,
            trigger=trigger,
            phase=Phase.PLANNED,
            created_at=at,
            previous_revision=previous_revision,
            no_rollback=no_rollback,
            restores=restores,
            fallback=fallback,
        )
        self.marks[dep_id] = [(Phase.PLANNED.value, at)]
        if plan is not None:
            self.record_plan(dep_id, plan)
        return self.get(dep_id)

    def transition(self, dep_id: int, phase: Phase, at: float, serving: ServingChange = NO_CHANGE) -> None:
        self.get(dep_id)  # an unknown deployment changes nothing, as the SQLite store's transaction
        self._put(dep_id, phase=phase, ended_at=at if is_terminal(phase) else None)
        self.marks[dep_id].append((phase.value, at))
        self.move_serving(serving)

    def move_serving(self, change: ServingChange) -> None:
        for host, revisions in change.sets:
            self.sets[host] = sorted(set(revisions))
        for host, revision in change.pointers:
            self.pointers[host] = revision

    def update_spec(self, dep_id: int, spec: UnitSpec) -> None:
        self._put(dep_id, spec=spec)

    def record_error(self, dep_id: int, *, error: str | None = None, rollback_error: str | None = None) -> None:
        if error is not None:
            self._put(dep_id, error=error)
        if rollback_error is not None:
            self._put(dep_id, rollback_error=rollback_error)

    def record_bench(self, dep_id: int, result: dict[str, Any]) -> None:
        self._put(dep_id, bench=dict(result))

    def serving_set(self, host: str) -> list[Deployment]:
        return [self.by_revision(host, r) for r in self.sets.get(host, [])]

    def record_plan(self, dep_id: int, plan: dict[str, Any]) -> None:
        self.plans[dep_id] = dict(plan)

    def plan_of(self, dep_id: int) -> dict[str, Any] | None:
        return self.plans.get(dep_id)

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None:
        self.log.append({"at": at, "host": host, "kind": kind, **detail})

    def get(self, dep_id: int) -> Deployment:
        if dep_id not in self.rows:
            raise StateError(f"deployment #{dep_id} does not exist in memory")
        marks = self.marks[dep_id]
        timings = tuple(
            PhaseTiming(p, at, marks[i + 1][1] if i + 1 < len(marks) else None)
            for i, (p, at) in enumerate(marks)
            if not is_terminal(Phase(p))
        )
        return replace(self.rows[dep_id], timings=timings)

    def by_revision(self, host: str, revision: int) -> Deployment:
        for dep_id, d in self.rows.items():
            if d.host == host and d.revision == revision:
                return self.get(dep_id)
        raise StateError(f"host {host} has no revision {revision}")

    def history(self, host: str | None = None, limit: int = 50) -> list[Deployment]:
        ids = [i for i in sorted(self.rows, reverse=True) if host is None or self.rows[i].host == host]
        return [self.get(i) for i in ids[:limit]]

    def unfinished(self, host: str | None = None) -> list[Deployment]:
        return [
            self.get(i)
            for i in sorted(self.rows)
            if not is_terminal(self.rows[i].phase) and (host is None or self.rows[i].host == host)
        ]

    def serving(self, host: str) -> Deployment | None:
        revision = self.pointers.get(host)
        return None if revision is None else self.by_revision(host, revision)

    def events(self, host: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        found = [
            e for e in reversed(self.log) if (host is None or e["host"] == host) and (kind is None or e["kind"] == kind)
        ]
        return found[:limit]


class FakeResidencyStore:
    """ResidencyStore in a dict, with the same last_served rule as the SQLite one."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Residency] = {}

    def set_state(
        self,
        host: str,
        model: str,
        state: str,
        at: float,
        *,
        level: str | None = None,
        unit: str = "",
        weights_gib: float | None = None,
    ) -> None:
        if state not in STATES:
            raise StateError(f"residency of {model} on {host}: state {state!r} is not one of {', '.join(STATES)}")
        old = self.rows.get((host, model))
        last = old.last_served if old is not None else None
        if state == SERVING or (old is not None and old.state == SERVING):
            last = at
        if weights_gib is None:
            weights_gib = old.weights_gib if old is not None else 0.0
        self.rows[host, model] = Residency(host, model, state, at, level, last, unit, weights_gib)

    def residency(self, host: str) -> dict[str, Residency]:
        return {m: r for (h, m), r in sorted(self.rows.items()) if h == host}
