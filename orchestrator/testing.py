"""In-memory fakes of every port, shipped with the package for tests of the core and the engine.

``FakeHost`` is one simulated machine: units with a scripted behaviour when started, GPU memory
held by their processes, an HTTP server per running unit. The fakes implement the ports in
``orchestrator.ports`` and nothing more; real-part tests use the adapters on booted test hosts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from orchestrator.core.catalog import Host
from orchestrator.core.observed import CommandResult, GpuInfo, GpuProcess, GpuSnapshot, UnitState
from orchestrator.core.records import NO_CHANGE, Deployment, PhaseTiming, ServingChange, UnitSpec
from orchestrator.core.resident import SERVING, STATES, Residency
from orchestrator.core.states import Fallback, Phase, fallback_of, is_terminal
from orchestrator.core.weights import StagedRevision
from orchestrator.errors import (
    CommandFailed,
    EngineError,
    HealthCheckFailed,
    ProxyError,
    StateError,
    SystemdError,
    UnitNotFound,
)
from orchestrator.ports import HostPorts, ProgressCallback, StagedWeights

Behaviour = Literal["ok", "crash", "health_only", "never_ready", "bad_unit"]


class FakeClock:
    """Time that only moves when someone sleeps: deterministic deadlines with no waiting."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.t = 0.0
        self.start = start
        self.on_sleep: list[Any] = []

    def now(self) -> float:
        return self.start + self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        for hook in self.on_sleep:
            hook()


@dataclass
class _Unit:
    text: str
    active: str = "inactive"
    sub: str = "dead"
    pid: int = 0
    status: int = 0
    restarts: int = 0
    enabled: bool = False
    started_at: float = 0.0


@dataclass
class FakeHost:
    """One simulated host; ``behaviours`` maps unit names to what happens when they start."""

    name: str = "fake"
    gpu_count: int = 8
    gpu_mib: int = 97_887
    load_s: float = 2.0
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    orphans: set[str] = field(default_factory=set)  # units whose processes survive a stop
    clock: FakeClock = field(default_factory=FakeClock)
    files: dict[str, bytes] = field(default_factory=dict)
    units: dict[str, _Unit] = field(default_factory=dict)
    holders: dict[int, tuple[tuple[int, ...], int, str, str]] = field(default_factory=dict)
    loaded: dict[str, str] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    journal: dict[str, list[str]] = field(default_factory=dict)  # unit -> its lines, when a test sets them
    # Sleep mode (FakeEngineControl): unit -> level while asleep; unit -> MiB its engine held awake;
    # units whose sleep keeps their memory ("leaky_sleep"), whose wake fails ("wedged_wake") or whose
    # wake answers 200 but whose completions then hang ("hangs_after_wake").
    sleeping: dict[str, int] = field(default_factory=dict)
    awake_mib: dict[str, int] = field(default_factory=dict)
    wedged: set[str] = field(default_factory=set)
    engine_behaviours: dict[str, Literal["leaky_sleep", "wedged_wake", "hangs_after_wake"]] = field(default_factory=dict)
    residue_mib: int = 1_800
    sizes: dict[str, int] = field(default_factory=dict)  # directory -> bytes, for `du -sbL`
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(4000))

    def ports(self, host: Host | None = None, weights: FakeWeights | None = None) -> HostPorts:
        spec = host or Host(name=self.name, gpus=self.gpu_count)
        return HostPorts(host=spec, shell=FakeShell(self), systemd=FakeSystemd(self), gpus=FakeGpus(self),
                         health=FakeHealth(self), clock=self.clock, weights=weights,
                         engine=FakeEngineControl(self))

    def hold(self, gpus: Sequence[int], mib: int, name: str = "python", unit: str = "") -> int:
        pid = next(self._pids)
        self.holders[pid] = (tuple(gpus), mib, name, unit)
        return pid

    def active_units(self) -> list[str]:
        return sorted(n for n, u in self.units.items() if u.active == "active")


class FakeShell:
    def __init__(self, world: FakeHost) -> None:
        self.host = world.name
        self.w = world

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True,
            idempotent: bool = False) -> CommandResult:
        if list(argv[:2]) == ["du", "-sbL"] and argv[-1] in self.w.sizes:  # the weights' size on disk
            return CommandResult(" ".join(argv), 0, f"{self.w.sizes[argv[-1]]}\t{argv[-1]}\n")
        result = CommandResult(" ".join(argv), 127, "", "fake shell runs no commands")
        if check:
            raise CommandFailed(result.command, 127, result.stderr, host=self.host)
        return result

    def run_streaming(self, argv: Sequence[str], on_line: Callable[[str], None], *,
                      timeout: float | None = None) -> CommandResult:
        return self.run(argv, check=False)

    def read_file(self, path: str) -> bytes | None:
        return self.w.files.get(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.w.files[path] = data

    def close(self) -> None:
        pass


class FakeSystemd:
    """Units in memory, held to the Systemd port's contract (the WITH_FAKES cases of
    tests/test_systemd_contract.py run here too)."""

    unit_dir = "/etc/systemd/system"

    def __init__(self, world: FakeHost) -> None:
        self.host = world.name
        self.w = world

    def unit_state(self, unit: str) -> UnitState:
        u = self.w.units.get(unit)
        if u is None or unit not in self.w.loaded:
            return UnitState(unit, "not-found", "inactive", "dead")
        load = "bad-setting" if self.w.behaviours.get(unit) == "bad_unit" else "loaded"
        return UnitState(unit, load, u.active, u.sub, u.pid, u.status, u.restarts,
                         "exit-code" if u.active == "failed" else "success",
                         fragment_path=f"{self.unit_dir}/{unit}")

    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        self.w.calls.append(f"start {unit}")
        u = self.w.units.get(unit)
        if u is None or unit not in self.w.loaded:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        if self.w.behaviours.get(unit) == "crash":
            u.active, u.sub, u.status = "failed", "failed", 1
            raise SystemdError(f"job for {unit} failed", host=self.host, unit=unit)
        if u.active == "active":
            return
        u.active, u.sub, u.started_at = "active", "running", self.w.clock.monotonic()
        u.pid = self.w.hold(self._gpus_of(u.text), 70_000, "VLLM::EngineCore", unit)

    def _gpus_of(self, text: str) -> tuple[int, ...]:
        for line in text.splitlines():
            if "CUDA_VISIBLE_DEVICES=" in line:
                return tuple(int(g) for g in line.split("=", 2)[-1].strip('"').split(","))
        return ()

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        self.w.calls.append(f"stop {unit}")
        u = self.w.units.get(unit)
        if u is None or u.active in ("inactive",):
            return
        u.active, u.sub, u.pid = "inactive", "dead", 0
        self.w.sleeping.pop(unit, None)
        self.w.wedged.discard(unit)
        if unit not in self.w.orphans:
            for pid in [p for p, h in self.w.holders.items() if h[3] == unit]:
                del self.w.holders[pid]

    def restart(self, unit: str, *, timeout: float = 90.0) -> None:
        self.stop(unit)
        self.start(unit)

    def reset_failed(self, unit: str) -> None:
        u = self.w.units.get(unit)
        if u is not None and u.active == "failed":
            u.active, u.sub = "inactive", "dead"

    def daemon_reload(self) -> None:
        self.w.calls.append("daemon-reload")
        self.w.loaded = {n: u.text for n, u in self.w.units.items()}

    def enable(self, unit: str) -> None:
        self._file(unit).enabled = True

    def disable(self, unit: str) -> None:
        self._file(unit).enabled = False

    def _file(self, unit: str) -> _Unit:
        u = self.w.units.get(unit)
        if u is None:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        return u

    def install_unit(self, unit: str, content: str) -> None:
        self.w.calls.append(f"install {unit}")
        old = self.w.units.get(unit)
        self.w.units[unit] = _Unit(content) if old is None else _Unit(content, old.active, old.sub, old.pid,
                                                                      old.status, old.restarts, old.enabled)

    def read_unit(self, unit: str) -> str | None:
        u = self.w.units.get(unit)
        return None if u is None else u.text

    def remove_unit(self, unit: str) -> None:
        self.w.units.pop(unit, None)

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]:
        return self.w.journal.get(unit, [f"{unit}: fake journal line"])[-lines:]

    def cgroup_pids(self, unit: str) -> list[int]:
        return sorted(p for p, h in self.w.holders.items() if h[3] == unit)

    def kill_unit(self, unit: str, signal: int) -> None:
        self.w.calls.append(f"kill {unit} {signal}")
        for pid in [p for p, h in self.w.holders.items() if h[3] == unit]:
            del self.w.holders[pid]


class FakeGpus:
    def __init__(self, world: FakeHost) -> None:
        self.w = world

    def snapshot(self) -> GpuSnapshot:
        used = {i: 0 for i in range(self.w.gpu_count)}
        procs = []
        for pid, (gpus, mib, name, _unit) in sorted(self.w.holders.items()):
            for g in gpus:
                used[g] = used.get(g, 0) + mib
                procs.append(GpuProcess(pid, name, f"GPU-{g}", mib, g))
        gpus_ = tuple(GpuInfo(i, f"GPU-{i}", "Fake GPU", self.w.gpu_mib, used[i]) for i in range(self.w.gpu_count))
        return GpuSnapshot(gpus_, tuple(procs))


class FakeHealth:
    """Answers for whichever unit listens on the URL's port, by that unit's behaviour."""

    def __init__(self, world: FakeHost) -> None:
        self.w = world

    def _unit_at(self, base_url: str) -> tuple[str, _Unit] | None:
        port = base_url.rsplit(":", 1)[-1]
        for name, u in self.w.units.items():
            if u.active == "active" and f'"--port" "{port}"' in u.text:
                return name, u
        return None

    def health(self, base_url: str) -> tuple[bool, str]:
        found = self._unit_at(base_url)
        if found is None:
            return False, "connection refused"
        name, u = found
        if self.w.behaviours.get(name) == "never_ready":
            return False, "503"
        ready = self.w.clock.monotonic() - u.started_at >= self.w.load_s
        return ready, "200" if ready else "503"

    def models(self, base_url: str) -> list[str]:
        found = self._unit_at(base_url)
        if found is None:
            raise HealthCheckFailed("connection refused")
        text = found[1].text
        return [text.split('"--served-model-name" "', 1)[1].split('"', 1)[0]]

    def complete(self, base_url: str, model: str) -> str:
        found = self._unit_at(base_url)
        if found is None or self.w.behaviours.get(found[0]) == "health_only":
            raise HealthCheckFailed(f"POST {base_url}/v1/completions: HTTP 500")
        return "x"


class FakeEngineControl:
    """vLLM's sleep API on the fake host's units: a sleeper keeps ``residue_mib`` per GPU, a wake
    without the memory fails with vLLM's words and wedges the engine, as measured on the H200."""

    def __init__(self, world: FakeHost) -> None:
        self.w = world

    def _unit(self, base_url: str) -> tuple[str, _Unit]:
        found = FakeHealth(self.w)._unit_at(base_url)
        if found is None:
            raise EngineError(f"POST {base_url}: no answer (ConnectError: connection refused)")
        return found

    def _holder(self, unit: str) -> int | None:
        return next((p for p, h in self.w.holders.items() if h[3] == unit), None)

    def _set_mib(self, unit: str, mib: int) -> None:
        pid = self._holder(unit)
        if pid is not None:
            gpus, _, name, owner = self.w.holders[pid]
            self.w.holders[pid] = (gpus, mib, name, owner)

    def sleep(self, base_url: str, level: int, mode: str = "wait") -> None:
        name, _ = self._unit(base_url)
        self.w.calls.append(f"sleep {name} level={level} mode={mode}")
        if name in self.w.sleeping:
            return
        pid = self._holder(name)
        self.w.awake_mib[name] = self.w.holders[pid][1] if pid is not None else 0
        self.w.sleeping[name] = level
        if self.w.engine_behaviours.get(name) != "leaky_sleep":
            self._set_mib(name, self.w.residue_mib)

    def wake(self, base_url: str, tags: Sequence[str] = ()) -> None:
        name, _ = self._unit(base_url)
        self.w.calls.append(f"wake {name}" + (f" tags={','.join(tags)}" if tags else ""))
        if name in self.w.wedged:
            raise EngineError(f"POST {base_url}/wake_up: HTTP 500: CUDA Error: invalid argument", status=500,
                              body="CUDA Error: invalid argument")
        if name not in self.w.sleeping or tags == ("weights",):
            return
        pid = self._holder(name)
        gpus, mib = (self.w.holders[pid][0], self.w.holders[pid][1]) if pid is not None else ((), 0)
        want = self.w.awake_mib.get(name, 0) - mib
        free = min((g.memory_free_mib for g in FakeGpus(self.w).snapshot().gpus if g.index in gpus), default=0)
        if self.w.engine_behaviours.get(name) == "wedged_wake" or free < want:
            self.w.wedged.add(name)
            self._set_mib(name, mib + max(min(free, want), 0) // 2)
            raise EngineError(f"POST {base_url}/wake_up: HTTP 500: CUDA Error: out of memory", status=500,
                              body="CUDA Error: out of memory")
        self._set_mib(name, self.w.awake_mib.get(name, mib))
        del self.w.sleeping[name]

    def is_sleeping(self, base_url: str) -> bool:
        return self._unit(base_url)[0] in self.w.sleeping

    def reload_weights(self, base_url: str) -> None:
        self.w.calls.append(f"reload_weights {self._unit(base_url)[0]}")

    def reset_prefix_cache(self, base_url: str) -> None:
        self._unit(base_url)

    def complete(self, base_url: str, model: str, timeout: float) -> str:
        name, _ = self._unit(base_url)
        if name in self.w.sleeping or name in self.w.wedged or \
                self.w.engine_behaviours.get(name) == "hangs_after_wake":
            self.w.clock.sleep(timeout)  # vLLM hangs it: no answer, no error
            raise EngineError(f"POST {base_url}/v1/completions: no answer (ReadTimeout: {timeout:g} s)")
        return "x"


class FakeWeights:
    """A weight store that stages instantly and records what it was asked for."""

    def __init__(self, resolved: str = "0" * 40) -> None:
        self.resolved = resolved
        self.staged: list[str] = []
        self.kept: list[list[str]] = []  # the models each cleanup was told to keep

    def stage(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        self.staged.append(spec.model)
        progress("staged", {"model": spec.model})
        return StagedWeights(path=spec.model_dir, revision=spec.revision, total_bytes=0)

    def verify(self, spec: UnitSpec) -> StagedWeights | None:
        return StagedWeights(path=spec.model_dir, revision=spec.revision, total_bytes=0)

    def cleanup(self, keep_serving: Iterable[UnitSpec]) -> list[StagedRevision]:
        self.kept.append(sorted(s.model for s in keep_serving))
        return []


class FakeSmoke:
    """Reports the single-stream tok/s it is told for each unit (default 100)."""

    def __init__(self, rates: dict[str, float] | None = None) -> None:
        self.rates = rates or {}

    def run(self, spec: UnitSpec) -> dict[str, Any]:
        rate = self.rates.get(spec.unit_name, 100.0)
        return {"levels": [{"concurrency": 1, "output_tok_s_per_stream": rate}], "headline_tok_s": rate}


class FakeConfigStore:
    """The ConfigStore port in memory, with the SQLite store's semantics (tests/unit/test_config_store.py
    runs one set of assertions against both)."""

    def __init__(self) -> None:
        self.revisions: list[tuple[float, str, str, str]] = []  # (at, sha256, operator, text); revision = index + 1
        self.deployments: dict[int, int] = {}

    def latest(self) -> tuple[int, str] | None:
        return (len(self.revisions), self.revisions[-1][1]) if self.revisions else None

    def record_if_new(self, at: float, sha256: str, operator: str, text: str,
                      then: Callable[[], None] | None = None) -> int:
        latest = self.latest()
        if latest is not None and latest[1] == sha256:
            revision, added = latest[0], False
        else:
            self.revisions.append((at, sha256, operator, text))
            revision, added = len(self.revisions), True
        if then is not None:
            try:
                then()
            except BaseException:
                if added:  # the transaction rolls back: the revision is not recorded either
                    self.revisions.pop()
                raise
        return revision

    def link(self, deployment_id: int, revision: int) -> None:
        self.deployments.setdefault(deployment_id, revision)

    def links(self) -> dict[int, int]:
        return dict(self.deployments)


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

    def create(self, host: str, spec: UnitSpec, trigger: str, previous_revision: int | None,
               at: float, no_rollback: bool = False, *, restores: int | None = None,
               fallback: Fallback | None = None, plan: dict[str, Any] | None = None) -> Deployment:
        dep_id = len(self.rows) + 1
        revision = 1 + max((d.revision for d in self.rows.values() if d.host == host), default=0)
        if fallback is None:
            fallback = fallback_of(previous_revision=previous_revision, in_set=False, no_rollback=no_rollback)
        self.rows[dep_id] = Deployment(id=dep_id, host=host, revision=revision, spec=spec, trigger=trigger,
                                       phase=Phase.PLANNED, created_at=at, previous_revision=previous_revision,
                                       no_rollback=no_rollback, restores=restores, fallback=fallback)
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

    def record_error(self, dep_id: int, *, error: str | None = None,
                     rollback_error: str | None = None) -> None:
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
        timings = tuple(PhaseTiming(p, at, marks[i + 1][1] if i + 1 < len(marks) else None)
                        for i, (p, at) in enumerate(marks) if not is_terminal(Phase(p)))
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
        return [self.get(i) for i in sorted(self.rows)
                if not is_terminal(self.rows[i].phase) and (host is None or self.rows[i].host == host)]

    def serving(self, host: str) -> Deployment | None:
        revision = self.pointers.get(host)
        return None if revision is None else self.by_revision(host, revision)

    def events(self, host: str | None = None, kind: str | None = None,
               limit: int = 50) -> list[dict[str, Any]]:
        found = [e for e in reversed(self.log) if (host is None or e["host"] == host)
                 and (kind is None or e["kind"] == kind)]
        return found[:limit]


class FakeResidencyStore:
    """ResidencyStore in a dict, with the same last_served rule as the SQLite one."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], Residency] = {}

    def set_state(self, host: str, model: str, state: str, at: float, *, level: str | None = None,
                  unit: str = "", weights_gib: float | None = None) -> None:
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


class FakeProxy:
    """The FrontProxy port in memory: the config it serves, every apply, and a port a test can take."""

    def __init__(self) -> None:
        self.config: str | None = None
        self.applied: list[str] = []
        self.busy = 0
        self.drains: list[list[tuple[str, int]]] = []
        self.taken_by: str | None = None
        self.counted: dict[tuple[str, int], Any] = {}  # engine -> core.haproxy_cli.Sessions

    def apply(self, config: str) -> bool:
        if self.config == config:
            return False
        if self.config is None and self.taken_by:
            raise ProxyError(self.taken_by)
        self.config = config
        self.applied.append(config)
        return True

    def draining(self, engines: Sequence[tuple[str, int]]) -> int | None:
        """Counts ``busy`` down, one per poll; every drain's engines are kept in ``drains``."""
        if not self.drains or self.drains[-1] != list(engines):
            self.drains.append(list(engines))
        self.busy = max(0, self.busy - 1)
        return self.busy

    def port_holder(self) -> str | None:
        return self.taken_by if self.config is None else None

    def sessions(self, engines: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        """What a test put in ``counted`` (engine -> Sessions) for the engines asked about."""
        return {e: self.counted[e] for e in engines if e in self.counted}


class FakeRolloutStore:
    """ports.RolloutStore in memory: the same records and refusals as rollout/store.py's file."""

    def __init__(self) -> None:
        from orchestrator.core.rollout import HostRecord

        self.path = "memory:rollouts"
        self.rollouts: dict[int, Any] = {}
        self.records: dict[int, list[HostRecord]] = {}
        self.times: dict[int, dict[str, list[float | None]]] = {}
        self.writes = 0  # every change, so a test can see one was made before an action

    def create(self, model: str, group: str, policy: Any, gate: str, batches: list[tuple[str, ...]],
               pid: int, *, started_by: str | None = None, at: float | None = None) -> int:
        from orchestrator.core.rollout import HostRecord, Rollout, RolloutStatus

        rid = len(self.rollouts) + 1
        self.rollouts[rid] = Rollout(id=rid, model=model, group=group, status=RolloutStatus.RUNNING, policy=policy,
                                     canary=policy.canary, gate=gate, started_at=at or 0.0, ended_at=None, pid=pid,
                                     abort_requested=False, reason=None, started_by=started_by)
        self.records[rid] = [HostRecord(host=h, batch=n) for n, b in enumerate(batches) for h in b]
        self.times[rid] = {h: [None, None] for b in batches for h in b}
        self.writes += 1
        return rid

    def set_host(self, rid: int, host: str, **fields: Any) -> None:
        times = {k: fields.pop(k) for k in ("switched_at", "ended_at") if k in fields}
        allowed = {"state", "baseline_id", "deployment_id", "outcome", "error"}
        if set(fields) - allowed:
            raise StateError(f"rollout store: no host field {min(set(fields) - allowed)!r}")
        self.records[rid] = [replace(r, **fields) if r.host == host else r for r in self.records[rid]]
        for k, v in times.items():
            self.times[rid][host][0 if k == "switched_at" else 1] = v
        self.writes += 1

    def finish(self, rid: int, status: Any, reason: str | None, at: float | None = None) -> None:
        self.rollouts[rid] = replace(self.get(rid), status=status, reason=reason, ended_at=at or 0.0)
        self.writes += 1

    def take_over(self, rid: int, pid: int) -> None:
        self.rollouts[rid] = replace(self.get(rid), pid=pid)
        self.writes += 1

    def request_abort(self, rid: int) -> None:
        self.rollouts[rid] = replace(self.get(rid), abort_requested=True)
        self.writes += 1

    def get(self, rid: int) -> Any:
        if rid not in self.rollouts:
            raise StateError(f"no rollout #{rid} in {self.path}")
        return self.rollouts[rid]

    def hosts(self, rid: int) -> list[Any]:
        return list(self.records[rid])

    def host_times(self, rid: int) -> dict[str, tuple[float | None, float | None]]:
        return {h: (t[0], t[1]) for h, t in self.times[rid].items()}

    def unfinished(self) -> list[Any]:
        return [r for _, r in sorted(self.rollouts.items()) if r.status.value == "running"]

    def latest(self) -> Any:
        return self.rollouts[max(self.rollouts)] if self.rollouts else None


class FakeTuneStore:
    """ports.TuneStore in memory."""

    def __init__(self) -> None:
        self.runs: dict[int, Any] = {}
        self.result_rows: dict[int, dict[str, Any]] = {}

    def create(self, host: str, model: str, settings: dict[str, Any], previous_revision: int | None,
               at: float) -> Any:
        from orchestrator.core.tune_records import RUNNING, TuneRun

        run_id = len(self.runs) + 1
        self.runs[run_id] = TuneRun(run_id, host, model, at, dict(settings), previous_revision, RUNNING, None, None)
        self.result_rows[run_id] = {}
        return self.runs[run_id]

    def record(self, r: Any) -> None:
        self.result_rows[r.run_id][r.candidate] = r

    def finish(self, run_id: int, state: str, at: float, result: dict[str, Any] | None) -> None:
        self.runs[run_id] = replace(self.get(run_id), state=state, ended_at=at, result=result)

    def get(self, run_id: int) -> Any:
        if run_id not in self.runs:
            raise StateError(f"tune run #{run_id} does not exist in memory")
        return self.runs[run_id]

    def unfinished(self, host: str) -> Any:
        running = [r for r in self.runs.values() if r.host == host and r.state == "running"]
        return running[-1] if running else None

    def finished(self, host: str, limit: int = 10) -> list[Any]:
        done = [r for r in self.runs.values() if r.host == host and r.state == "done" and r.result is not None]
        return sorted(done, key=lambda r: -r.id)[:limit]

    def results(self, run_id: int) -> list[Any]:
        return sorted(self.result_rows[run_id].values(), key=lambda r: r.at)
