"""The catalog: hosts, models and schedules as validated, immutable data.

These are the shapes of deploy.toml. Field-level rules live here (pure); cross-references between
sections (a schedule naming an unknown model, two models on one port) are checked in ``Catalog``.
Loading the file and the environment is ``orchestrator.settings``' job.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.core.safety import check_safe_text

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Inline values under these names would end up in a world-readable unit file and in logs.
SECRET_KEY_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE_KEY|CREDENTIALS?)$", re.IGNORECASE)
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# A served name the front proxy can match and list: HAProxy's `-m str` takes space-separated words
# inside a config line, and the name is written into JSON bodies, so no spaces, quotes or escapes.
ROUTABLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")

Name = Annotated[str, Field(pattern=NAME_RE.pattern)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _safe(value: str, what: str) -> str:
    check_safe_text(value, what)
    return value


class Defaults(_Strict):
    """Values every model inherits unless it sets its own."""

    user: str = "vllm"
    group: str = "vllm"
    engine: tuple[str, ...] = ("/opt/vllm/bin/vllm", "serve")
    bind: str = "0.0.0.0"
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    load_deadline_s: float = Field(900.0, gt=0)
    stop_timeout_s: float = Field(120.0, gt=0)
    free_timeout_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(0.2, gt=0)
    restart_sec: float = Field(10.0, ge=0)
    start_limit_burst: int = Field(3, ge=1)
    env_dir: str = "/etc/orchestrator/env"

    @field_validator("user", "group", "bind", "env_dir")
    @classmethod
    def _safe_text(cls, v: str) -> str:
        return _safe(v, "value")

    @field_validator("engine")
    @classmethod
    def _safe_engine(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or not v[0].startswith("/"):
            raise ValueError(f"engine must start with an absolute executable path, got {list(v)!r}")
        for arg in v:
            _safe(arg, "engine argument")
        return v


class Host(_Strict):
    """One machine with GPUs, reached locally (D-Bus) or over SSH."""

    name: Name = ""
    transport: Literal["local", "ssh"] = "ssh"
    address: str = "127.0.0.1"
    ssh_port: int = Field(22, ge=1, le=65535)
    ssh_user: str = "root"
    ssh_key: str | None = None
    known_hosts: str | None = None
    gpus: int = Field(8, ge=0, le=64)
    gpu_memory_gib: float = Field(80.0, gt=0)
    interconnect: Literal["pcie", "nvlink", "unknown"] = "unknown"
    models_dir: str = "/models"
    unit_dir: str = "/etc/systemd/system"
    python: str = "/usr/bin/python3"
    engine: tuple[str, ...] | None = None
    bind: str | None = None  # the address vLLM listens on; defaults.bind when unset

    @field_validator("address", "ssh_user", "models_dir", "unit_dir", "python", "bind")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")


class Model(_Strict):
    """One servable model: where its weights come from and how vLLM runs it."""

    name: Name = ""
    host: Name | None = None
    repo: str
    revision: str = "main"
    source: str = "hub"
    served_name: str | None = None
    port: int = Field(8000, ge=1, le=65535)
    gpus: tuple[int, ...]
    tensor_parallel: int = Field(1, ge=1)
    pipeline_parallel: int = Field(1, ge=1)
    data_parallel: int = Field(1, ge=1)
    expert_parallel: bool = False
    max_model_len: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    load_deadline_s: float | None = Field(None, gt=0)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()

    @field_validator("repo", "revision", "source", "served_name")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")

    @field_validator("args")
    @classmethod
    def _safe_args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for arg in v:
            _safe(arg, "argument")
        return v

    @field_validator("env")
    @classmethod
    def _safe_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"environment variable name {key!r} is not a valid name")
            if SECRET_KEY_RE.search(key):
                raise ValueError(f"{key} looks like a secret: put it in the host's environment file "
                                 f"(EnvironmentFile), never inline in deploy.toml")
            _safe(value, f"value of {key}")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("a model needs at least one GPU index")
        if len(set(v)) != len(v):
            raise ValueError(f"GPU indices repeat: {list(v)}")
        if min(v) < 0:
            raise ValueError(f"GPU index {min(v)} is negative")
        return v

    @model_validator(mode="after")
    def _layout_matches_gpus(self) -> Model:
        need = self.tensor_parallel * self.pipeline_parallel * self.data_parallel
        if need != len(self.gpus):
            raise ValueError(
                f"tensor_parallel {self.tensor_parallel} x pipeline_parallel {self.pipeline_parallel} x "
                f"data_parallel {self.data_parallel} = {need} GPUs, but gpus lists {len(self.gpus)}: "
                f"{list(self.gpus)}")
        return self

    @property
    def served(self) -> str:
        return self.served_name or self.name

    @property
    def unit_name(self) -> str:
        return f"vllm-{self.name}.service"

    @property
    def pinned(self) -> bool:
        return bool(SHA_RE.match(self.revision))


class Schedule(_Strict):
    """A cron-driven operation: switch to a model, or redeploy what runs."""

    name: Name = ""
    cron: str
    host: Name | None = None
    action: Literal["switch", "redeploy", "stage"] = "switch"
    model: Name | None = None
    window: str | None = Field(None, pattern=r"^\d{2}:\d{2}-\d{2}:\d{2}$")
    on_busy: Literal["skip"] = "skip"
    timezone: str = "UTC"

    @model_validator(mode="after")
    def _model_needed(self) -> Schedule:
        if self.action in ("switch", "stage") and not self.model:
            raise ValueError(f"action {self.action!r} needs a model")
        return self


class Policy(_Strict):
    """What the agent does on its own."""

    rollback_on_failure: bool = True
    watch_interval_s: float = Field(15.0, gt=0)
    unhealthy_after_s: float = Field(60.0, gt=0)
    on_unhealthy: Literal["restart", "rollback", "record"] = "restart"
    smoke_bench: bool = False
    min_tok_s_ratio: float | None = Field(None, gt=0, le=1)
    keep_revisions: int = Field(2, ge=1)


class Proxy(_Strict):
    """The front proxy (HAProxy) on every host: one endpoint that routes by the request's model."""

    enabled: bool = False
    port: int = Field(8000, ge=1, le=65535)
    bind: str | None = None  # the address it listens on; the host's bind (or defaults.bind) when unset
    stats_socket: str = Field("/run/orchestrator-proxy/admin.sock", pattern=r"^/[A-Za-z0-9._/-]+$")
    config_path: str = Field("/etc/orchestrator/haproxy.cfg", pattern=r"^/[A-Za-z0-9._/-]+$")
    haproxy: str = Field("/usr/sbin/haproxy", pattern=r"^/[A-Za-z0-9._/-]+$")
    drain_timeout_s: float = Field(30.0, gt=0, le=3600)
    retry_after_s: int = Field(5, ge=1, le=3600)

    @field_validator("bind")
    @classmethod
    def _safe_bind(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[A-Za-z0-9.:\[\]-]+$", v):
            raise ValueError(f"bind must be an address, got {v!r}")
        return v


class Catalog(_Strict):
    """The whole deploy.toml, cross-checked."""

    state_dir: str = "/var/lib/orchestrator"
    socket_group: str = "orchestrator"
    metrics_port: int = Field(9464, ge=0, le=65535)  # Prometheus on 127.0.0.1; 0 turns it off
    defaults: Defaults = Field(default_factory=Defaults)
    policy: Policy = Field(default_factory=Policy)
    proxy: Proxy = Field(default_factory=Proxy)
    hosts: dict[Name, Host]
    models: dict[Name, Model] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: object) -> object:
        # deploy.toml names tables by key ([models.minimax-m25]); copy the key into each entry.
        if isinstance(data, dict):
            for section in ("hosts", "models", "schedules"):
                table = data.get(section)
                if isinstance(table, dict):
                    data[section] = {k: ({**v, "name": k} if isinstance(v, dict) else v)
                                     for k, v in table.items()}
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> Catalog:
        for name, model in self.models.items():
            host = self.model_host(name)
            too_high = [g for g in model.gpus if g >= host.gpus]
            if too_high:
                raise _KeyedError(f"models.{name}.gpus",
                                  f"GPU index {too_high[0]} is out of range: host {host.name} has "
                                  f"{host.gpus} GPUs (0-{host.gpus - 1})")
        seen: dict[tuple[str, int], str] = {}
        for name, model in self.models.items():
            key = (self.model_host(name).name, model.port)
            if key in seen:
                raise _KeyedError(f"models.{name}.port",
                                  f"port {model.port} is already used by model {seen[key]} on host "
                                  f"{key[0]}")
            seen[key] = name
        if self.proxy.enabled:
            self._check_routable()
        for name, sched in self.schedules.items():
            if sched.model and sched.model not in self.models:
                raise _KeyedError(f"schedules.{name}.model",
                                  f"unknown model {sched.model!r} (known: {', '.join(sorted(self.models))})")
            if sched.host and sched.host not in self.hosts:
                raise _KeyedError(f"schedules.{name}.host", f"unknown host {sched.host!r}")
        return self

    def _check_routable(self) -> None:
        """With the proxy on, every served name must be routable and no model may take its port."""
        for name, model in self.models.items():
            if not ROUTABLE_RE.match(model.served):
                raise _KeyedError(f"models.{name}.served_name",
                                  f"{model.served!r} cannot be routed by the front proxy: use letters, "
                                  f"digits and . _ : / @ + - (no spaces or quotes), at most 128")
            if model.port == self.proxy.port:
                raise _KeyedError(f"models.{name}.port",
                                  f"port {model.port} is the front proxy's port ([proxy] port); give the "
                                  f"engine another one")

    def model_host(self, model: str) -> Host:
        """The host a model runs on: its own ``host`` or the only host there is."""
        spec = self.models[model]
        if spec.host is not None:
            if spec.host not in self.hosts:
                raise _KeyedError(f"models.{model}.host",
                                  f"unknown host {spec.host!r} (known: {', '.join(sorted(self.hosts))})")
            return self.hosts[spec.host]
        if len(self.hosts) != 1:
            raise _KeyedError(f"models.{model}.host",
                              f"missing: there are {len(self.hosts)} hosts, say which one serves it")
        return next(iter(self.hosts.values()))

    def models_on(self, host: str) -> list[str]:
        return [m for m in self.models if self.model_host(m).name == host]

    def engine_for(self, host: Host) -> tuple[str, ...]:
        return host.engine or self.defaults.engine


class _KeyedError(ValueError):
    """A cross-reference error that knows its key path (pydantic would only say 'value_error')."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
