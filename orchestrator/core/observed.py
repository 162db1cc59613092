"""What the adapters observe on a host, as plain immutable data the core can reason about."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CommandResult:
    """Outcome of one command run through a Shell."""

    command: str
    exit_code: int
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class UnitState:
    """The systemd properties of one unit that the engine decides on."""

    name: str
    load_state: str  # loaded | not-found | bad-setting | error | masked
    active_state: str  # active | reloading | inactive | failed | activating | deactivating
    sub_state: str
    main_pid: int = 0
    exec_main_status: int = 0
    n_restarts: int = 0
    result: str = "success"
    control_group: str = ""
    fragment_path: str = ""
    # When its main process last started (epoch seconds, ExecMainStartTimestamp): systemd's own
    # restarts move it too. None: never started, or not known.
    started_at: float | None = None

    @property
    def exists(self) -> bool:
        return self.load_state not in ("not-found", "")

    @property
    def is_active(self) -> bool:
        return self.active_state in ("active", "reloading", "activating")

    @property
    def is_failed(self) -> bool:
        return self.active_state == "failed"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi reports it (memory in MiB, as nvidia-smi's nounits output)."""

    index: int
    uuid: str
    name: str
    memory_total_mib: int
    memory_used_mib: int

    @property
    def memory_free_mib(self) -> int:
        return max(self.memory_total_mib - self.memory_used_mib, 0)


@dataclass(frozen=True)
class GpuProcess:
    """One compute process holding memory on one GPU."""

    pid: int
    process_name: str
    gpu_uuid: str
    used_memory_mib: int
    gpu_index: int = -1


@dataclass(frozen=True)
class GpuSnapshot:
    """All GPUs and their compute processes, observed at one moment."""

    gpus: tuple[GpuInfo, ...]
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    def on(self, indices: frozenset[int] | set[int]) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.processes if p.gpu_index in indices)


def listens_on(line: str, bind: str, port: int) -> bool:
    """Whether an `ss -ltn` line's local address conflicts with bind:port."""
    fields = line.split()
    if len(fields) < 4:
        return False
    local = fields[3]
    addr = local.rsplit(":", 1)[0].strip("[]")
    wildcard = {"0.0.0.0", "*", "::"}
    return local.endswith(f":{port}") and (addr in wildcard or bind in wildcard or addr == bind)
