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
from orchestrator.errors import UsageError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Inline values under these names would end up in a world-readable unit file and in logs.
SECRET_KEY_RE = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|PRIVATE_KEY|CREDENTIALS?)$", re.IGNORECASE)
SHA_RE = re.compile(r"^[0-9a-f]{40}$")

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
    agent_socket: str | None = None  # a controller's rollout reaches the box's agent here (relay --socket)

    @field_validator("address", "ssh_user", "models_dir", "unit_dir", "python", "bind", "agent_socket")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")


class Model(_Strict):
    """One servable model: where its weights come from and how vLLM runs it."""

    name: Name = ""
    host: Name | None = None
    group: Name | None = None  # a fleet model: one replica per host of [groups.NAME], switched by `rollout`
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

    @field_validator("source")
    @classmethod
    def _source_form(cls, v: str) -> str:
        kind, sep, arg = v.partition(":")
        ok = (v in ("hub", "none") or (kind == "local" and arg.startswith("/"))
              or (kind == "host" and bool(NAME_RE.match(arg))))
        if not ok or (kind in ("local", "host") and not sep):
            raise ValueError(f"source {v!r} is not \"hub\", \"none\", \"local:/absolute/dir\" or "
                             "\"host:NAME\" (a host of this file that already staged the model)")
        return v

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

    @model_validator(mode="after")
    def _host_or_group(self) -> Model:
        if self.host is not None and self.group is not None:
            raise ValueError(f"set host ({self.host!r}) or group ({self.group!r}), not both")
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


class Group(_Strict):
    """Hosts that run the same models, one replica each, and how a rollout moves across them.

    The vocabulary is Nomad's and Ansible's: ``canary`` hosts switch first and alone, then ``batch``
    hosts at a time; more than ``max_failures`` failed hosts stop the rollout. ``gate`` is checked
    on every switched host before the next batch starts."""

    name: Name = ""
    hosts: tuple[Name, ...]
    canary: int = Field(1, ge=0)
    batch: int = Field(1, ge=1)
    max_failures: int = Field(0, ge=0)
    gate: Literal["none", "health", "bench"] = "health"
    seed: Name | None = None  # the one host that downloads from the hub; the others copy from a peer
    peer_key: str | None = None  # on every box: the key its rsync uses to reach a peer box
    peer_known_hosts: str | None = None  # on every box: the peers' host keys

    @field_validator("peer_key", "peer_known_hosts")
    @classmethod
    def _safe_paths(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r} is not an absolute path (a path on every box of the group)")
        return None if v is None else _safe(v, "value")

    @field_validator("hosts")
    @classmethod
    def _hosts_listed_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a group needs at least one host")
        twice = sorted({h for h in v if v.count(h) > 1})
        if twice:
            raise ValueError(f"host {twice[0]!r} is listed more than once")
        return v


class Catalog(_Strict):
    """The whole deploy.toml, cross-checked."""

    state_dir: str = "/var/lib/orchestrator"
    socket_group: str = "orchestrator"
    metrics_port: int = Field(9464, ge=0, le=65535)  # Prometheus on 127.0.0.1; 0 turns it off
    defaults: Defaults = Field(default_factory=Defaults)
    policy: Policy = Field(default_factory=Policy)
    hosts: dict[Name, Host]
    models: dict[Name, Model] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)
    groups: dict[Name, Group] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: object) -> object:
        # deploy.toml names tables by key ([models.minimax-m25]); copy the key into each entry.
        if isinstance(data, dict):
            for section in ("hosts", "models", "schedules", "groups"):
                table = data.get(section)
                if isinstance(table, dict):
                    data[section] = {k: ({**v, "name": k} if isinstance(v, dict) else v)
                                     for k, v in table.items()}
        return data

    @model_validator(mode="after")
    def _groups_known(self) -> Catalog:
        for name, group in self.groups.items():
            unknown = [h for h in group.hosts if h not in self.hosts]
            if unknown:
                raise _KeyedError(f"groups.{name}.hosts",
                                  f"unknown host {unknown[0]!r} (known: {', '.join(sorted(self.hosts))})")
            if group.seed is not None and group.seed not in group.hosts:
                raise _KeyedError(f"groups.{name}.seed",
                                  f"seed {group.seed!r} is not a host of the group ({', '.join(group.hosts)})")
        for name, model in self.models.items():
            if model.group is not None and model.group not in self.groups:
                known = ", ".join(sorted(self.groups)) or "none"
                raise _KeyedError(f"models.{name}.group", f"unknown group {model.group!r} (known: {known})")
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Catalog:
        for name, model in self.models.items():
            for host in self.model_hosts(name):
                too_high = [g for g in model.gpus if g >= host.gpus]
                if too_high:
                    raise _KeyedError(f"models.{name}.gpus",
                                      f"GPU index {too_high[0]} is out of range: host {host.name} has "
                                      f"{host.gpus} GPUs (0-{host.gpus - 1})")
        seen: dict[tuple[str, int], str] = {}
        for name, model in self.models.items():
            for host in self.model_hosts(name):
                key = (host.name, model.port)
                if key in seen:
                    raise _KeyedError(f"models.{name}.port",
                                      f"port {model.port} is already used by model {seen[key]} on host "
                                      f"{key[0]}")
                seen[key] = name
        for name, sched in self.schedules.items():
            if sched.model and sched.model not in self.models:
                raise _KeyedError(f"schedules.{name}.model",
                                  f"unknown model {sched.model!r} (known: {', '.join(sorted(self.models))})")
            if sched.host and sched.host not in self.hosts:
                raise _KeyedError(f"schedules.{name}.host", f"unknown host {sched.host!r}")
        return self

    @model_validator(mode="after")
    def _peer_sources(self) -> Catalog:
        """``source = "host:NAME"``: a peer copy needs another known host and a pinned revision (the
        peer's directory is named by the commit)."""
        for name, model in self.models.items():
            if not model.source.startswith("host:"):
                continue
            peer, key = model.source.removeprefix("host:"), f"models.{name}.source"
            if peer not in self.hosts:
                raise _KeyedError(key, f"source {model.source!r} names unknown host {peer!r} "
                                       f"(known: {', '.join(sorted(self.hosts))})")
            if model.group is not None:
                raise _KeyedError(key, f"source {model.source!r}: a group model's weights come from the hub "
                                       "once per rollout (the seed host pulls, the others copy from a peer)")
            if peer == self.model_host(name).name:
                raise _KeyedError(key, f"source {model.source!r} is the model's own host {peer!r}; "
                                       "copy from another host, or use \"hub\"")
            if not model.pinned:
                raise _KeyedError(key, f"source {model.source!r} needs revision pinned to a commit SHA "
                                       f"(got revision {model.revision!r})")
        return self

    def model_hosts(self, model: str) -> list[Host]:
        """Every host a model runs on: its group's hosts, else its one host."""
        spec = self.models[model]
        if spec.group is not None:
            return [self.hosts[h] for h in self.groups[spec.group].hosts]
        return [self.model_host(model)]

    def model_host(self, model: str) -> Host:
        """The host a model runs on: its own ``host`` or the only host there is."""
        spec = self.models[model]
        if spec.group is not None:
            raise UsageError(f"model {model!r} runs on every host of group {spec.group!r} "
                             f"({', '.join(self.groups[spec.group].hosts)}): switch it with "
                             f"`orchestrator rollout {model}`")
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
        return [m for m in self.models if host in (h.name for h in self.model_hosts(m))]

    def engine_for(self, host: Host) -> tuple[str, ...]:
        return host.engine or self.defaults.engine


class _KeyedError(ValueError):
    """A cross-reference error that knows its key path (pydantic would only say 'value_error')."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
