"""The hosts of deploy.toml and the defaults their engines run with, as validated data."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.core.catalog_rules import (
    DAY,
    IFNAME_RE,
    LOGIN_RE,
    PATH_RE,
    USER_RE,
    Name,
    Strict,
    SubKeyError,
    absolute_path,
    check_address,
    check_engine,
    key_file,
    not_root,
    outside_private_tmp,
    ram_reserve_gib,
    safe,
    socket_file,
)
from orchestrator.core.safety import shown
from orchestrator.engines import ENGINE

INSTALLED_PYTHON = "/opt/orchestrator/venv/bin/python"  # `agent install`'s current venv on a box


class Defaults(Strict):
    """Values every model inherits unless it sets its own."""

    user: str = ENGINE.default_user
    group: str = ENGINE.default_user
    engine: tuple[str, ...] = ENGINE.default_command
    bind: str = "0.0.0.0"
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    # Upper bounds keep every value a number systemd and the agent's timers accept.
    load_deadline_s: float = Field(900.0, ge=1, le=7 * DAY)
    # A sleep-enabled model: how long the proxy holds its requests during a warm swap, and how long
    # a wake plus its first completion may take before the engine counts as wedged.
    wake_deadline_s: float = Field(30.0, ge=1, le=DAY)
    stop_timeout_s: float = Field(120.0, ge=1, le=DAY)
    free_timeout_s: float = Field(60.0, gt=0, le=DAY)
    health_interval_s: float = Field(0.2, ge=0.01, le=3600)
    restart_sec: float = Field(10.0, ge=0, le=DAY)
    start_limit_burst: int = Field(3, ge=1, le=1000)
    env_dir: str = "/etc/orchestrator/env"
    # Ray's CLI on every node of a model with backend = "ray" (the same Ray version everywhere).
    ray: str = ENGINE.default_ray
    # How long a Ray model's switch waits for every node to join the head (not the whole load deadline).
    ray_join_timeout_s: float = Field(120.0, ge=1, le=DAY)
    # Engines as root only where the box is disposable (a test bed): see catalog_rules.not_root.
    allow_root: bool = False

    @field_validator("user", "group", "bind", "env_dir", "ray")
    @classmethod
    def _safe_text(cls, v: str) -> str:
        return safe(v, "value")

    @field_validator("bind")
    @classmethod
    def _bind_address(cls, v: str) -> str:
        return check_address(v, "bind")

    @field_validator("user", "group")
    @classmethod
    def _account(cls, v: str) -> str:
        if not USER_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a valid user or group name (lower case letters, digits, '_', '-')")
        return v

    @field_validator("env_dir")
    @classmethod
    def _env_dir(cls, v: str) -> str:
        if not PATH_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} must be an absolute path without spaces or quotes")
        return absolute_path(v, "env_dir")

    @field_validator("engine")
    @classmethod
    def _safe_engine(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_engine(v)

    @field_validator("ray")
    @classmethod
    def _absolute(cls, v: str, info: ValidationInfo) -> str:
        return absolute_path(v, str(info.field_name))

    @model_validator(mode="after")
    def _unprivileged_engines(self) -> Defaults:
        if not self.allow_root:
            try:
                not_root(self.user)
            except ValueError as exc:
                raise SubKeyError(".user", str(exc)) from None
        return self


class Host(Strict):
    """One machine with GPUs, reached locally (D-Bus) or over SSH."""

    name: Name = ""
    transport: Literal["local", "ssh"] = "ssh"
    address: str = "127.0.0.1"
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_user: str = "root"
    ssh_key: str | None = None
    known_hosts: str | None = None
    gpus: int = Field(8, ge=0, le=64)
    gpu_memory_gib: float = Field(80.0, gt=0, le=65536)
    interconnect: Literal["pcie", "nvlink", "unknown"] = "unknown"
    models_dir: str = "/models"
    unit_dir: str = "/etc/systemd/system"
    # The product's interpreter there (stage worker, proxy CLI); unset: the agent's own when local,
    # INSTALLED_PYTHON over SSH (what `agent install` makes). /usr/bin/python3 lacks the product.
    python: str | None = None
    engine: tuple[str, ...] | None = None
    bind: str | None = None  # the address the engines listen on; defaults.bind when unset
    agent_socket: str | None = None  # a controller's rollout reaches the box's agent here (relay --socket)
    # Multi-node models: the address the other nodes reach this host at (default: address), the
    # network interface Gloo/NCCL use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), and the network
    # between boxes (the planner warns when tensor parallel would cross it).
    node_address: str | None = None
    interface: str | None = None
    network: Literal["infiniband", "roce", "ethernet", "unknown"] = "unknown"
    ray: str | None = None  # Ray's CLI on this host; defaults.ray when unset
    # What the engine runs on here; unset: what the engine tells from its command line (its CPU
    # build: "cpu"), else "cuda". The CPU build has no sleep mode.
    platform: Literal["cuda", "rocm", "xpu", "cpu"] | None = None
    # Host RAM (GiB) for warm switches: the box's memory, the budget for sleeping weights (level1
    # sleepers hold their weights there; unset: memory_gib minus a reserve, see core.residency), and
    # the GPU memory (GiB per GPU) a sleeping engine keeps (measured 1.2-3.0 GiB on an H200).
    memory_gib: float | None = Field(None, gt=0, le=1 << 24)
    sleep_ram_gib: float | None = Field(None, ge=0, le=1 << 24)
    sleep_residue_gib: float = Field(3.0, ge=0, le=65536)
    # How the agent reads GPU memory by PID: "nvml" (NVIDIA's library in the agent's own process, a
    # local host only), "nvidia-smi" (run through the host's shell), "auto": NVML on a local host
    # where it initialises, else nvidia-smi.
    gpu_probe: Literal["auto", "nvml", "nvidia-smi"] = "auto"

    @field_validator(
        "address",
        "ssh_user",
        "models_dir",
        "unit_dir",
        "python",
        "bind",
        "agent_socket",
        "node_address",
        "interface",
        "ray",
    )
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else safe(v, "value")

    @field_validator("address", "bind", "node_address")
    @classmethod
    def _addresses(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else check_address(v, info.field_name or "address")

    @field_validator("engine")
    @classmethod
    def _safe_engine(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else check_engine(v)

    @field_validator("ssh_user")
    @classmethod
    def _login(cls, v: str) -> str:
        if not LOGIN_RE.fullmatch(v):
            raise ValueError(
                f"ssh_user {shown(v)} is not a user name (letters, digits, '.', '_', '-'; at most 32, "
                "starting with a letter or '_')"
            )
        return v

    @field_validator("ssh_key", "known_hosts")
    @classmethod
    def _client_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else key_file(v, str(info.field_name))

    @field_validator("interface")
    @classmethod
    def _interface_name(cls, v: str | None) -> str | None:
        # A Linux interface name (IFNAMSIZ 16 with its NUL), the one word GLOO/NCCL_SOCKET_IFNAME name.
        if v is not None and not IFNAME_RE.fullmatch(v):
            raise ValueError(
                f"interface {shown(v)} is not a network interface name (letters, digits and . _ - @ :, "
                "at most 15, as `ip link` lists them)"
            )
        return v

    @field_validator("agent_socket")
    @classmethod
    def _socket_fits(cls, v: str | None) -> str | None:
        return None if v is None else socket_file(v, "agent_socket", suffix=False)

    @model_validator(mode="after")
    def _nvml_is_local(self) -> Host:
        if self.gpu_probe == "nvml" and self.transport != "local":
            raise SubKeyError(
                ".gpu_probe",
                f'gpu_probe "nvml" reads the GPUs of the machine the agent runs on: '
                f'it needs transport = "local" (this host is "{self.transport}"); '
                'use "nvidia-smi" or "auto"',
            )
        return self

    @model_validator(mode="after")
    def _sleep_budgets_possible(self) -> Host:
        if self.sleep_ram_gib is not None and self.memory_gib is not None and self.sleep_ram_gib > self.memory_gib:
            raise SubKeyError(
                ".sleep_ram_gib",
                f"sleep_ram_gib {self.sleep_ram_gib:g} is more than the host's "
                f"memory_gib {self.memory_gib:g}: sleepers' weights live in host RAM",
            )
        # Only when set: a small GPU with no sleep model keeps loading with the default.
        if "sleep_residue_gib" in self.model_fields_set and self.sleep_residue_gib >= self.gpu_memory_gib:
            raise SubKeyError(
                ".sleep_residue_gib",
                f"sleep_residue_gib {self.sleep_residue_gib:g} is not less than "
                f"gpu_memory_gib {self.gpu_memory_gib:g}: it is what a sleeping "
                "engine keeps of one GPU",
            )
        return self

    def sleep_ram_budget(self, probed_memory_gib: float | None = None) -> float | None:
        """GiB of host RAM sleepers may hold: `sleep_ram_gib`, else the box's memory (`memory_gib`,
        else ``probed_memory_gib``: MemTotal of /proc/meminfo) minus the reserve; None when unknown."""
        if self.sleep_ram_gib is not None:
            return self.sleep_ram_gib
        memory = self.memory_gib if self.memory_gib is not None else probed_memory_gib
        return None if memory is None else max(0.0, memory - ram_reserve_gib(memory))

    @property
    def peer_address(self) -> str:
        """Where the other nodes of a multi-node model reach this host."""
        return self.node_address or self.address

    @field_validator("models_dir", "unit_dir", "python", "ray", "agent_socket")
    @classmethod
    def _absolute(cls, v: str | None, info: ValidationInfo) -> str | None:
        return None if v is None else absolute_path(v, str(info.field_name))

    @field_validator("models_dir")
    @classmethod
    def _models_dir_visible(cls, v: str) -> str:
        outside_private_tmp(v, "models_dir")
        return v
