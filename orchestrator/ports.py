"""The small interfaces between the application (the deployer, the agent) and the outside world.

Each port has a real adapter in ``orchestrator.adapters`` and an in-memory fake in
``orchestrator.testing``. Adapters are chosen once, per host, when the operations are built.
Every method raises only ``orchestrator.errors`` types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.observed import CommandResult, GpuSnapshot, UnitState
from orchestrator.core.proxy import HostRouting
from orchestrator.core.records import NO_CHANGE, Deployment, ServingChange, UnitSpec
from orchestrator.core.resident import Residency
from orchestrator.core.states import Fallback, Phase
from orchestrator.core.weights import StagedRevision
from orchestrator.engines import engine_named

if TYPE_CHECKING:  # so that `--host` queries, which never read a catalog here, do not build its models
    from orchestrator.core.catalog import Host
    from orchestrator.core.rollout import HostRecord, Policy, Rollout, RolloutStatus
    from orchestrator.core.tune_records import TuneResult, TuneRun


class Shell(Protocol):
    """Runs commands and touches files on one host (locally or over one SSH connection)."""

    host: str

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        """Run argv (quoted for the remote shell by the adapter). ``check`` raises CommandFailed
        on a non-zero exit; ``idempotent`` allows a retry after a dropped connection."""
        ...

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        """Run argv, calling on_line for each line of stdout as it arrives (long jobs: staging).
        Never raises on a non-zero exit; the caller reads the result."""
        ...

    def read_file(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        ...

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Write atomically: a temp file in the same directory, fsync, rename."""
        ...

    def close(self) -> None: ...


class UnitJobs(Protocol):
    """Systemd jobs on one host's units: what the stop, start and reap steps drive."""

    host: str

    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        """Start and wait for the job to finish (not for the service to be healthy)."""
        ...

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        """Stop and wait for the job; stopping an inactive or unknown unit is a no-op."""
        ...

    def restart(self, unit: str, *, timeout: float = 90.0) -> None: ...

    def reset_failed(self, unit: str) -> None: ...

    def kill_unit(self, unit: str, signal: int) -> None:
        """Send a signal to every process of the unit's cgroup."""
        ...


class UnitFiles(Protocol):
    """Unit files of one host and the manager's view of them: the install step's port."""

    def install_unit(self, unit: str, content: str) -> None:
        """Write the unit file atomically into the host's unit directory (no reload)."""
        ...

    def read_unit(self, unit: str) -> str | None:
        """The installed unit file's text, or None."""
        ...

    def remove_unit(self, unit: str) -> None: ...

    def daemon_reload(self) -> None: ...

    def enable(self, unit: str, *, reload: bool = True) -> bool:
        """Enable the unit; whether its links changed. ``reload=False``: the caller reloads once
        for several changes (each reload re-reads every unit file of the host)."""
        ...

    def disable(self, unit: str, *, reload: bool = True) -> bool:
        """Disable the unit; whether its links changed (``reload`` as for enable)."""
        ...


class UnitInspector(Protocol):
    """Read-only views of units: the watch, readiness and error messages need only these."""

    def unit_state(self, unit: str) -> UnitState:
        """Never raises for an unknown unit: returns load_state 'not-found'."""
        ...

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]: ...

    def cgroup_pids(self, unit: str) -> list[int]:
        """PIDs still in the unit's cgroup (processes a stop left behind)."""
        ...


class Systemd(UnitJobs, UnitFiles, UnitInspector, Protocol):
    """The systemd manager of one host: every role, as the D-Bus and SSH adapters implement it."""


class GpuProbe(Protocol):
    """nvidia-smi (or a stand-in) on one host."""

    def snapshot(self) -> GpuSnapshot: ...


class HealthProbe(Protocol):
    """HTTP probes of one OpenAI-compatible server."""

    def health(self, base_url: str) -> tuple[bool, str]:
        """(ok, detail) for GET /health."""
        ...

    def models(self, base_url: str) -> list[str]:
        """Served model ids from GET /v1/models (raises HealthCheckFailed on a bad answer)."""
        ...

    def complete(self, base_url: str, model: str) -> str:
        """One 1-token completion; returns the text or raises HealthCheckFailed."""
        ...


class EngineControl(Protocol):
    """The engine's sleep-mode API (its paths: ``orchestrator.engines`` ``SleepApi``) on one model's
    engine, named by its base URL.

    Free of systemd on purpose: a base URL is all it needs (it also runs against a real engine on a box
    without an init). Errors are EngineError with the engine's HTTP status and body."""

    def sleep(self, base_url: str, level: int, mode: str = "wait") -> None:
        """POST /sleep?level=N&mode=M; ``wait`` lets in-flight requests finish (``abort`` cuts them)."""
        ...

    def wake(self, base_url: str, tags: Sequence[str] = ()) -> None:
        """POST /wake_up (every tag), or /wake_up?tags=... for part of the engine (level 2: weights first)."""
        ...

    def is_sleeping(self, base_url: str) -> bool:
        """GET /is_sleeping: /health answers 200 while asleep, this does not lie."""
        ...

    def reload_weights(self, base_url: str) -> None:
        """Level 2: POST /collective_rpc reload_weights (the weights were dropped while asleep)."""
        ...

    def reset_prefix_cache(self, base_url: str) -> None:
        """POST /reset_prefix_cache: the last step of a level-2 wake (cached blocks refer to old weights)."""
        ...

    def complete(self, base_url: str, model: str, timeout: float) -> str:
        """One 1-token completion within ``timeout`` seconds: a woken engine that cannot answer is wedged."""
        ...


class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch (for records)."""
        ...

    def monotonic(self) -> float:
        """Monotonic seconds (for deadlines)."""
        ...

    def sleep(self, seconds: float) -> None: ...


ProgressCallback = Callable[[str, dict[str, Any]], None]
"""Receives (event, fields) for progress the CLI shows: phase changes, bytes downloaded, polls."""


@dataclass(frozen=True)
class StagedWeights:
    """Weights verified on a host: where they are and which exact revision they are."""

    path: str
    revision: str
    total_bytes: int


class WeightStore(Protocol):
    """Stages and verifies model weights on one host."""

    def stage(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        """Download (or copy) and verify the weights for spec; idempotent when already staged."""
        ...

    def verify(self, spec: UnitSpec) -> StagedWeights | None:
        """The verified staged weights, or None when they are not (completely) there."""
        ...

    def cleanup(self, keep_serving: Iterable[UnitSpec]) -> list[StagedRevision]:
        """Remove old staged revisions by policy, never those of ``keep_serving``; returns the removed."""
        ...


class DeploymentRecords(Protocol):
    """Durable deployment records: each switch, its phases, errors, plan and benchmark."""

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
        """A planned deployment; ``fallback`` None: the one of a switch without the front proxy.
        ``plan`` (front proxy) is recorded in the same transaction: never a deployment without it."""
        ...

    def transition(self, dep_id: int, phase: Phase, at: float, serving: ServingChange = NO_CHANGE) -> None:
        """Enter ``phase``; with it, in the same transaction, what serves changes as ``serving`` says."""
        ...

    def update_spec(self, dep_id: int, spec: UnitSpec) -> None: ...

    def record_error(self, dep_id: int, *, error: str | None = None, rollback_error: str | None = None) -> None: ...

    def record_bench(self, dep_id: int, result: dict[str, Any]) -> None: ...

    def record_plan(self, dep_id: int, plan: dict[str, Any]) -> None:
        """With the front proxy: how the deployment changes the serving set (core.switch_plan.SwitchPlan)."""
        ...

    def plan_of(self, dep_id: int) -> dict[str, Any] | None: ...

    def get(self, dep_id: int) -> Deployment: ...

    def by_revision(self, host: str, revision: int) -> Deployment: ...

    def history(self, host: str | None = None, limit: int = 50) -> list[Deployment]: ...

    def unfinished(self, host: str | None = None) -> list[Deployment]: ...


class ServingRecords(Protocol):
    """What serves on each host: the pointer (the revision a plain switch serves) and, with the
    front proxy, the serving set. One way to change them: a ServingChange, moved on its own (`stop`)
    or with a deployment's phase (``DeploymentRecords.transition``)."""

    def move_serving(self, change: ServingChange) -> None:
        """Move pointers and sets as ``change`` says, in one transaction."""
        ...

    def serving(self, host: str) -> Deployment | None: ...

    def serving_set(self, host: str) -> list[Deployment]: ...


class EventLog(Protocol):
    """Events outside deployments (a schedule skipped, a watch restart), newest first."""

    def record_event(self, at: float, host: str | None, kind: str, detail: dict[str, Any]) -> None: ...

    def events(self, host: str | None = None, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]: ...


class ResidencyStore(Protocol):
    """Durable residency of each model on a host (serving, asleep at a level, stopped): beside the
    deployment records, in a file of its own (adapters/residency_store.py)."""

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
        """Record ``model``'s new state; leaving ``serving`` stamps last_served with ``at``;
        ``weights_gib`` None keeps the size recorded before."""
        ...

    def residency(self, host: str) -> dict[str, Residency]:
        """Every model of ``host`` with a record, by name."""
        ...


class StateStore(DeploymentRecords, ServingRecords, EventLog, Protocol):
    """The agent's state.db, all three roles (see adapters.sqlite_store): what the wiring hands over."""


class ConfigStore(Protocol):
    """The agent's config revisions and which one each deployment ran with (adapters.config_store)."""

    def latest(self) -> tuple[int, str] | None:
        """(revision, sha256) of the newest recorded revision, or None."""
        ...

    def record_if_new(
        self, at: float, sha256: str, operator: str, text: str, then: Callable[[], None] | None = None
    ) -> int:
        """Record ``text`` unless the newest revision has the same sha256; its revision. ``then`` runs
        in the same transaction, after the insert: when it raises, nothing is recorded."""
        ...

    def link(self, deployment_id: int, revision: int) -> None: ...

    def links(self) -> dict[int, int]:
        """deployment id -> the config revision it ran with."""
        ...


class SmokeBench(Protocol):
    """A short benchmark of a freshly started server (see orchestrator.adapters.smoke)."""

    def run(self, spec: UnitSpec) -> dict[str, Any]:
        """The bench record, with ``headline_tok_s`` = single-stream output tok/s."""
        ...


class FrontProxy(Protocol):
    """The host's front proxy unit (see adapters.haproxy): one endpoint routing by ``model``."""

    def apply(self, routing: HostRouting) -> bool:
        """Make the running proxy route as ``routing`` says (the adapter renders its own config from
        it): install its unit, write and check the config, start or gracefully reload; idempotent.
        Where the running proxy serves the config on disk and the new one differs only in which of a
        name's engines serves (a switch between alternates), the running proxy moves the route
        without a reload (its requests in flight at the engine it left stay in it: ``sessions``
        counts them), the file written first. Returns whether anything changed, once the new routing
        serves (proxy processes of earlier configs are then known to be old)."""
        ...

    def prepare(self, routing: HostRouting) -> None:
        """Do ahead what ``apply(routing)`` must do before its reload where that changes nothing that
        runs or is read at a restart (render, and check the config with the proxy's own parser), so
        that ``apply`` of the same routing soon after only writes and reloads: a warm switch decides
        when its route moves and wants the move to follow at once. Nothing on disk that the proxy
        serves from changes; an ``apply`` of another routing ignores it."""
        ...

    def move(self, routing: HostRouting) -> bool:
        """``apply(routing)`` where it needs no reload, else nothing: the running proxy serves the config
        on disk and the new one differs only in which of its backends' servers are disabled (models on
        demand: a name whose engines all leave keeps its backend, every server disabled, and is held),
        so the route moves through the runtime API, the file written first. False, with no route
        changed, where only a reload could (then ``withdraw`` or ``apply``)."""
        ...

    def draining(self, engines: Sequence[tuple[str, int]]) -> int | None:
        """How many proxy processes of earlier configs can still send a request to one of these
        engines (address, port): 0 when they may stop; None when the proxy could not tell."""
        ...

    def withdraw(self, engines: Sequence[tuple[str, int]]) -> bool:
        """Models on demand: the running proxy stops sending requests to these engines (address, port)
        at once, without a reload (a name on demand whose engine left is then held, others answer 503);
        requests already there finish (``sessions`` counts them). The next ``apply`` reloads, whatever
        it renders. False when it could not (the proxy does not run the config it was last given):
        nothing changed, ``apply`` a config without them instead."""
        ...

    def port_holder(self) -> str | None:
        """When the proxy does not run: what already listens on its address and port, else None."""
        ...

    def stop(self) -> bool:
        """Stop and disable the proxy unit ([proxy] enabled = false): its port is free and it does not
        come back at boot; True when it was running. ``apply`` starts it again."""
        ...

    def sessions(self, engines: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Sessions]:
        """Each engine's sessions now and seconds since its last one, over every proxy worker
        (models on demand: idleness); an engine the proxy has no server for is left out."""
        ...


class RolloutStore(Protocol):
    """A controller's record of its rollouts (rollout/store.py; testing.FakeRolloutStore). Each change
    is durable when the call returns: the controller acts on the next host only after it."""

    path: Any  # where the record lives, as errors name it

    def create(
        self,
        model: str,
        group: str,
        policy: Policy,
        gate: str,
        batches: list[tuple[str, ...]],
        pid: int,
        *,
        started_by: str | None = None,
        at: float | None = None,
    ) -> int: ...

    def set_host(self, rid: int, host: str, **fields: Any) -> None: ...

    def set_hosts(self, rid: int, hosts: Mapping[str, Mapping[str, Any]]) -> None:
        """set_host for many hosts, committed together (one transaction: all or none)."""
        ...

    def finish(self, rid: int, status: RolloutStatus, reason: str | None, at: float | None = None) -> None: ...

    def take_over(self, rid: int, pid: int) -> None: ...

    def request_abort(self, rid: int) -> None: ...

    def get(self, rid: int) -> Rollout: ...

    def hosts(self, rid: int) -> list[HostRecord]: ...

    def host_times(self, rid: int) -> dict[str, tuple[float | None, float | None]]: ...

    def unfinished(self) -> list[Rollout]: ...

    def latest(self) -> Rollout | None: ...

    def recent(self, limit: int, group: str | None = None) -> list[Rollout]: ...


class TuneStore(Protocol):
    """Tune runs and each candidate's measurement (adapters/tune_store.py; testing.FakeTuneStore); a
    result is recorded before the next candidate starts, so a resumed run never measures one twice."""

    def create(
        self, host: str, model: str, settings: dict[str, Any], previous_revision: int | None, at: float
    ) -> TuneRun: ...

    def record(self, r: TuneResult) -> None: ...

    def finish(self, run_id: int, state: str, at: float, result: dict[str, Any] | None) -> None: ...

    def get(self, run_id: int) -> TuneRun: ...

    def unfinished(self, host: str) -> TuneRun | None: ...

    def finished(self, host: str, limit: int = 10) -> list[TuneRun]: ...

    def results(self, run_id: int) -> list[TuneResult]: ...


@dataclass
class HostPorts:
    """The adapters for one host, chosen once when the operations are built (orchestrator.wiring)."""

    host: Host
    shell: Shell
    systemd: Systemd
    gpus: GpuProbe
    health: HealthProbe
    clock: Clock
    weights: WeightStore | None = None
    smoke: SmokeBench | None = None
    proxy: FrontProxy | None = None
    # Each engine's sleep-mode control, by engine name (orchestrator.engines.ENGINES' keys).
    engine_controls: Mapping[str, EngineControl] = field(default_factory=dict)

    def engine_control_for(self, spec: UnitSpec) -> EngineControl | None:
        """The control of the engine ``spec`` runs on, or None when that engine runs the unit without
        sleep mode (the engine reads its unit) or this host has no control for it: then the model
        never sleeps and is stopped instead."""
        if not engine_named(spec.engine).sleeps(spec.unit_text):
            return None
        return self.engine_controls.get(spec.engine)

    def close(self) -> None:
        self.shell.close()
