"""Deployment records: what was deployed where, how it went, and how long each phase took."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from orchestrator.core.states import Fallback, Phase
from orchestrator.engines import ENGINE


class Mode(StrEnum):
    """How a switch changes a host's serving set (core.switch_plan plans it; persisted with the deployment)."""

    HANDOVER = "handover"  # start beside the old one, move the route, drain, stop: no downtime
    # The GPUs overlap but both fit awake (core.beside): start or wake the target beside, check it,
    # move the route, drain, then the old one sleeps or stops. No gap either.
    BESIDE = "beside"
    STOP_START = "stop_start"  # the GPUs overlap: stop, free, start; the route answers 503 meanwhile
    ADD = "add"  # nothing serves this name yet: the models on its GPUs (if any) stop first

    @property
    def keeps_serving(self) -> bool:
        """The displaced engines serve until the route moves (nothing stops before the target starts)."""
        return self in (Mode.HANDOVER, Mode.BESIDE)


def host_port(address: str, port: int) -> str:
    """ADDRESS:PORT for a message, an IPv6 literal (with its zone) in brackets: [fe80::1%eth0]:22."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class NodeUnit:
    """One more unit of a multi-node model: a headless rank, a Ray head or a Ray worker, on its host."""

    host: str
    role: str  # "headless" | "ray-head" | "ray-worker"
    rank: int
    unit_name: str
    unit_text: str
    unit_sha: str
    model_dir: str = ""  # the weights on this node (its own models_dir); "" in records made before

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeUnit:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class UnitSpec:
    """Everything needed to run (or re-run, on rollback) one model's unit, frozen at planning time.

    A rollback redeploys this recorded spec, not the catalog's current entry, which may have
    changed since (hashicorp/nomad#10337).
    """

    model: str
    unit_name: str
    unit_text: str
    unit_sha: str
    served_name: str
    address: str
    port: int
    gpus: tuple[int, ...]
    load_deadline_s: float
    model_dir: str
    repo: str = ""
    revision: str = ""
    source: str = "hub"
    # A multi-node model: its other units, in start order (they stop in reverse); this spec's own
    # unit (rank 0, the API) starts after them all, on the deployment's host.
    nodes: tuple[NodeUnit, ...] = ()
    backend: str = ""
    # An engine adopted as a process started by hand outside systemd (`orchestrator adopt`): its PID
    # and start time (/proc/PID/stat's 22nd field, so a recycled PID is never taken for it). The next
    # switch stops that process; the unit above (rendered from its entry) is what a rollback starts.
    pid: int | None = None
    pid_start: int | None = None
    # The engine the unit runs (orchestrator.engines.ENGINES' key): it says whether the unit sleeps and
    # which control (HostPorts.engine_control_for) puts it to sleep and wakes it. Older records: the default engine.
    engine: str = ENGINE.name

    @property
    def node_hosts(self) -> tuple[str, ...]:
        """The other hosts a multi-node spec runs on, in start order, each once."""
        return tuple(dict.fromkeys(n.host for n in self.nodes))

    @property
    def base_url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address  # an IPv6 literal
        return f"http://{host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnitSpec:
        """The spec recorded in ``data``; keys a newer version added are ignored."""
        known = {f.name for f in fields(cls)} - {"gpus", "nodes"}
        return cls(
            **{k: v for k, v in data.items() if k in known},
            gpus=tuple(data["gpus"]),
            nodes=tuple(NodeUnit.from_dict(n) for n in data.get("nodes") or ()),
        )


@dataclass(frozen=True)
class ServingChange:
    """What a deployment's outcome changes about what serves, written with the outcome in one
    transaction: a crash between the two left a deployment ended that recovery never revisits, with
    the pointer on what served before (a wrong `status`, a wrong "previous stable" for rollback)."""

    pointers: tuple[tuple[str, int | None], ...] = ()  # (host, revision serving there; None: nothing)
    sets: tuple[tuple[str, tuple[int, ...]], ...] = ()  # with the front proxy: (host, its serving set)

    def __bool__(self) -> bool:
        return bool(self.pointers or self.sets)


NO_CHANGE = ServingChange()


@dataclass(frozen=True)
class PhaseTiming:
    phase: str
    entered_at: float
    left_at: float | None

    @property
    def seconds(self) -> float | None:
        return None if self.left_at is None else self.left_at - self.entered_at


@dataclass(frozen=True)
class Deployment:
    id: int
    host: str
    revision: int
    spec: UnitSpec
    trigger: str
    phase: Phase
    created_at: float
    previous_revision: int | None = None
    ended_at: float | None = None
    error: str | None = None
    rollback_error: str | None = None
    no_rollback: bool = False
    timings: tuple[PhaseTiming, ...] = field(default_factory=tuple)
    bench: dict[str, Any] | None = None
    # The revision whose recorded unit this deployment redeploys as it is (a rollback, tune's
    # restore); None: a switch to the catalog's model. Data, not a reading of the trigger's words.
    restores: int | None = None
    fallback: Fallback = Fallback.NONE

    @property
    def model(self) -> str:
        return self.spec.model

    def went_through(self, phase: Phase) -> bool:
        """Whether this deployment entered ``phase`` (its recorded timings say)."""
        return any(t.phase == phase for t in self.timings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "host": self.host,
            "revision": self.revision,
            "model": self.model,
            "unit": self.spec.unit_name,
            "unit_sha256": self.spec.unit_sha,
            "weights_revision": self.spec.revision,
            "trigger": self.trigger,
            "outcome": self.phase.value,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "previous_revision": self.previous_revision,
            "restores": self.restores,
            "error": self.error,
            "rollback_error": self.rollback_error,
            "phases": [{"phase": t.phase, "seconds": t.seconds} for t in self.timings],
            "bench": self.bench,
            "nodes": [{"host": n.host, "role": n.role, "rank": n.rank, "unit": n.unit_name} for n in self.spec.nodes],
        }


@dataclass(frozen=True)
class SwitchResult:
    """What a switch or a rollback answers, read back from its wire form (``Deployment.to_dict`` with
    ``noop`` and ``recovered``, or a no-op's message): the outcome is a Phase, never a string compared."""

    host: str
    model: str
    revision: int | None
    outcome: Phase | None  # where the deployment ended (None: a no-op, or a stop of what it added)
    noop: bool = False
    error: str | None = None
    rollback_error: str | None = None
    deployment_id: int | None = None
    wire: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # every field as answered

    @property
    def ok(self) -> bool:
        """Nothing to do, or the switch ended active."""
        return self.noop or self.outcome is Phase.ACTIVE

    @property
    def ended(self) -> Phase | str:
        """The outcome, or the word the answer gave instead (``stopped``): for a message."""
        return self.outcome if self.outcome is not None else str(self.wire.get("outcome") or "failed")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwitchResult:
        word = data.get("outcome")
        try:
            outcome = Phase(word) if word is not None else None
        except ValueError:  # "stopped" (a rollback of what a switch added), or a newer version's word
            outcome = None
        revision, dep = data.get("revision"), data.get("id")
        return cls(
            host=str(data.get("host") or ""),
            model=str(data.get("model") or ""),
            revision=int(revision) if revision is not None else None,
            outcome=outcome,
            noop=bool(data.get("noop")),
            error=data.get("error"),
            rollback_error=data.get("rollback_error"),
            deployment_id=int(dep) if dep is not None else None,
            wire=dict(data),
        )
