"""What a step sees (StepContext, StepInput) and what it hands back to persist (StepResult)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.catalog import Catalog, Defaults
from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.states import Event
from orchestrator.core.switch_plan import SwitchPlan
from orchestrator.errors import Abandoned
from orchestrator.ports import HostPorts, ProgressCallback, ResidencyStore
from orchestrator.secrets import redact_tree


class Parked(Exception):
    """The agent is stopping: leave the step unfinished; re-running it later is safe.

    Not an OrchestratorError on purpose: it is not a failure and must never trigger a rollback.
    """


@dataclass
class StepContext:
    """One host's ports and tunables, for the length of one deployment run."""

    ports: HostPorts
    catalog: Catalog
    progress: ProgressCallback
    # Units of this host's catalog plus whatever is recorded as serving: the only units a switch
    # may stop, and the only cgroups whose leftover processes it may kill.
    managed_units: frozenset[str] = frozenset()
    bound: dict[str, Any] = field(default_factory=dict)
    free_threshold_mib: int = 1024
    completion_attempts: int = 3
    park: threading.Event = field(default_factory=threading.Event)
    # A multi-node model: the context of another of its hosts (deploy/multinode.py).
    node_ctx: Callable[[str], StepContext] | None = None
    # Persist one piece of a step's progress at once (the engine writes it to the store with the
    # deployment and phase): what a step did on each node survives a crash in the middle of it.
    record: Callable[[str, dict[str, Any]], None] = lambda kind, detail: None
    # Warm switches: each model's residency on this host (serving, asleep, stopped); None: no sleep.
    residency: ResidencyStore | None = None
    # Models on demand: while the target cold-starts, why to give up (every waiting request was
    # cancelled), else None; asked at each poll. The engine sets it for the target's own phases only.
    abandon: Callable[[], str | None] | None = None
    # A warm switch's window (route moved .. target woken) reads no unit: the PIDs staging read are
    # reused inside it. One run's: a resumed run reads again; a unit that restarted meanwhile makes a
    # memory check fail safe (its new PIDs count as foreign).
    seen_pids: dict[str, frozenset[int]] = field(default_factory=dict)
    # (model, weights folder) this host's access check passed for in this run's operation, before the
    # deployment was recorded (Planner.check_access): preflight does not probe the host again for them.
    access_checked: frozenset[tuple[str, str]] = frozenset()

    @property
    def defaults(self) -> Defaults:
        return self.catalog.defaults

    def emit(self, event: str, **fields: Any) -> None:
        self.progress(event, redact_tree({**self.bound, **fields}))

    def pause(self, seconds: float) -> None:
        """Sleep between polls, unless the agent is stopping: then park the step."""
        if self.park.is_set():
            raise Parked()
        why = self.abandon() if self.abandon is not None else None
        if why:
            raise Abandoned(why)
        self.ports.clock.sleep(seconds)


@dataclass(frozen=True)
class StepInput:
    """The deployment as the engine read it before the step, with what the records say around it."""

    dep: Deployment
    previous: Deployment | None  # the previous stable revision, when there is one
    units_to_stop: frozenset[str]  # the serving unit, the target itself, and managed units on its GPUs
    # Re-render the target for weights staged at (path, revision): the engine owns rendering.
    respec: Callable[[str, str], UnitSpec]
    # Multi-node: units to stop beyond units_to_stop, by host, in stop order (the other nodes' and
    # the head's extra units), and what served on the other nodes, to bring back on rollback.
    node_units_to_stop: Mapping[str, frozenset[str]] = field(default_factory=dict)
    peer_restore: Mapping[str, UnitSpec] = field(default_factory=dict)
    # What ctx.record persisted for this deployment so far (a run before a crash included), oldest first.
    node_progress: tuple[Mapping[str, Any], ...] = ()
    # With the front proxy: how this switch changes the serving set, and that set when it was planned.
    plan: SwitchPlan | None = None
    serving: tuple[Deployment, ...] = ()
    # What the warm steps persisted for this deployment so far (ctx.record kind "warm"), oldest first.
    warm_progress: tuple[Mapping[str, Any], ...] = ()

    @property
    def displaced(self) -> tuple[Deployment, ...]:
        return tuple(d for d in self.serving if self.plan and d.revision in self.plan.displaced)

    @property
    def overlapping(self) -> tuple[Deployment, ...]:
        return tuple(d for d in self.serving if self.plan and d.revision in self.plan.overlapping)

    @property
    def kept(self) -> tuple[Deployment, ...]:
        """The serving models this switch leaves alone."""
        return tuple(d for d in self.serving if self.plan and d.revision not in self.plan.displaced)


@dataclass(frozen=True)
class StepResult:
    """What the engine persists after a step, before the next one runs."""

    spec: UnitSpec | None = None  # the target's spec changed (staging resolved path and revision)
    bench: dict[str, Any] | None = None  # the smoke benchmark's record
    event: Event = Event.OK  # what the step reports: the table says where it leads (warm: from staging)


DONE = StepResult()
