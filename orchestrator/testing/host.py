"""One simulated machine (FakeHost) and the ports it answers: shell, systemd, GPUs, health,
vLLM's sleep API. They share its state, so they live together."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.core.catalog import Host
from orchestrator.core.commands import command_line
from orchestrator.core.observed import CommandResult, GpuInfo, GpuProcess, GpuSnapshot, UnitState
from orchestrator.engines import ENGINE, ENGINES, Engine
from orchestrator.errors import (
    CommandFailed,
    EngineError,
    HealthCheckFailed,
    SystemdError,
    UnitNotFound,
)
from orchestrator.ports import HostPorts, WeightStore
from orchestrator.testing.clock import FakeClock

Behaviour = Literal["ok", "crash", "health_only", "never_ready", "bad_unit"]


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
    commands: list[tuple[str, ...]] = field(default_factory=list)  # every argv its shell was asked to run
    reads: list[str] = field(default_factory=list)  # units whose cgroup PIDs were read, in order
    journal: dict[str, list[str]] = field(default_factory=dict)  # unit -> its lines, when a test sets them
    # Sleep mode (FakeEngineControl): unit -> level while asleep; unit -> MiB its engine held awake;
    # units whose sleep keeps their memory ("leaky_sleep"), whose wake fails ("wedged_wake") or whose
    # wake answers 200 but whose completions then hang ("hangs_after_wake").
    sleeping: dict[str, int] = field(default_factory=dict)
    awake_mib: dict[str, int] = field(default_factory=dict)
    wedged: set[str] = field(default_factory=set)
    engine_behaviours: dict[str, Literal["leaky_sleep", "wedged_wake", "hangs_after_wake"]] = field(
        default_factory=dict
    )
    residue_mib: int = 1_800
    start_mib: dict[str, int] = field(default_factory=dict)  # unit -> MiB per GPU it takes on start (default 70,000)
    sizes: dict[str, int] = field(default_factory=dict)  # directory -> bytes, for `du -sbL`
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(4000))

    def ports(self, host: Host | None = None, weights: WeightStore | None = None) -> HostPorts:
        spec = host or Host(name=self.name, gpus=self.gpu_count)
        return HostPorts(
            host=spec,
            shell=FakeShell(self),
            systemd=FakeSystemd(self),
            gpus=FakeGpus(self),
            health=FakeHealth(self),
            clock=self.clock,
            weights=weights,
            engine_controls={name: FakeEngineControl(self, engine) for name, engine in ENGINES.items()},
        )

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

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        self.w.commands.append(tuple(argv))
        if list(argv[:2]) == ["du", "-sbL"] and argv[-1] in self.w.sizes:  # the weights' size on disk
            self.w.calls.append(f"du {argv[-1]}")
            return CommandResult(" ".join(argv), 0, f"{self.w.sizes[argv[-1]]}\t{argv[-1]}\n")
        result = CommandResult(command_line(argv), 127, "", "fake shell runs no commands")
        if check:
            raise CommandFailed(result.command, 127, result.stderr, host=self.host)
        return result

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        return self.run(argv, check=False)

    def read_file(self, path: str) -> bytes | None:
        return self.w.files.get(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.w.files[path] = data

    def close(self) -> None:
        pass


class FakeSystemd:
    """Units in memory, held to the Systemd port's contract (the WITH_FAKES cases of
    tests/test_systemd_contract_hosts.py run here too)."""

    unit_dir = "/etc/systemd/system"

    def __init__(self, world: FakeHost) -> None:
        self.host = world.name
        self.w = world

    def unit_state(self, unit: str) -> UnitState:
        u = self.w.units.get(unit)
        if u is None or unit not in self.w.loaded:
            return UnitState(unit, "not-found", "inactive", "dead")
        load = "bad-setting" if self.w.behaviours.get(unit) == "bad_unit" else "loaded"
        clock = self.w.clock
        return UnitState(
            unit,
            load,
            u.active,
            u.sub,
            u.pid,
            u.status,
            u.restarts,
            "exit-code" if u.active == "failed" else "success",
            fragment_path=f"{self.unit_dir}/{unit}",
            started_at=None if u.active == "inactive" else clock.now() - clock.monotonic() + u.started_at,
        )

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
        u.pid = self.w.hold(self._gpus_of(u.text), self.w.start_mib.get(unit, 70_000), "VLLM::EngineCore", unit)

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

    def enable(self, unit: str, *, reload: bool = True) -> bool:
        return self._set_enabled(unit, True, reload)

    def disable(self, unit: str, *, reload: bool = True) -> bool:
        return self._set_enabled(unit, False, reload)

    def _set_enabled(self, unit: str, enabled: bool, reload: bool) -> bool:
        """As the adapters do: a change of links reloads the manager unless the caller will."""
        u = self._file(unit)
        changed = u.enabled != enabled
        u.enabled = enabled
        if changed and reload:
            self.daemon_reload()
        return changed

    def _file(self, unit: str) -> _Unit:
        u = self.w.units.get(unit)
        if u is None:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        return u

    def install_unit(self, unit: str, content: str) -> None:
        self.w.calls.append(f"install {unit}")
        old = self.w.units.get(unit)
        self.w.units[unit] = (
            _Unit(content)
            if old is None
            else _Unit(content, old.active, old.sub, old.pid, old.status, old.restarts, old.enabled)
        )

    def read_unit(self, unit: str) -> str | None:
        u = self.w.units.get(unit)
        return None if u is None else u.text

    def remove_unit(self, unit: str) -> None:
        self.w.units.pop(unit, None)

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]:
        return self.w.journal.get(unit, [f"{unit}: fake journal line"])[-lines:]

    def cgroup_pids(self, unit: str) -> list[int]:
        self.w.reads.append(unit)
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
    """An engine's sleep API (vLLM's by default) on the fake host's units: a sleeper keeps
    ``residue_mib`` per GPU, a wake without the memory fails with vLLM's words and wedges the engine,
    as measured on the H200."""

    def __init__(self, world: FakeHost, engine: Engine = ENGINE) -> None:
        self.w = world
        self._api = engine.sleep_api
        self._completions = engine.completions_path

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
            raise EngineError(
                f"POST {base_url}{self._api.wake}: HTTP 500: CUDA Error: invalid argument",
                status=500,
                body="CUDA Error: invalid argument",
            )
        if name not in self.w.sleeping or tags == ("weights",):
            return
        pid = self._holder(name)
        gpus, mib = (self.w.holders[pid][0], self.w.holders[pid][1]) if pid is not None else ((), 0)
        want = self.w.awake_mib.get(name, 0) - mib
        free = min((g.memory_free_mib for g in FakeGpus(self.w).snapshot().gpus if g.index in gpus), default=0)
        if self.w.engine_behaviours.get(name) == "wedged_wake" or free < want:
            self.w.wedged.add(name)
            self._set_mib(name, mib + max(min(free, want), 0) // 2)
            raise EngineError(
                f"POST {base_url}{self._api.wake}: HTTP 500: CUDA Error: out of memory",
                status=500,
                body="CUDA Error: out of memory",
            )
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
        if name in self.w.sleeping or name in self.w.wedged or self.w.engine_behaviours.get(name) == "hangs_after_wake":
            self.w.clock.sleep(timeout)  # vLLM hangs it: no answer, no error
            raise EngineError(f"POST {base_url}{self._completions}: no answer (ReadTimeout: {timeout:g} s)")
        return "x"
