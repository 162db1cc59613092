"""The catalog: hosts, models and schedules as validated, immutable data.

These are the shapes of deploy.toml. Field-level rules live here (pure); cross-references between
sections (a schedule naming an unknown model, two models on one port) are checked in ``Catalog``.
Loading the file and the environment is ``orchestrator.settings``' job.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestrator.core import schedule as schedule_rules
from orchestrator.core.safety import check_safe_text, shown
from orchestrator.core.secrets import scan, secret_in_args, secret_name, secret_value_kind
from orchestrator.errors import RenderError, UsageError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
PATH_RE = re.compile(r"^/[^\s\"'\\]*$")
# A Hugging Face repo id: [owner/]name, letters, digits, "-", "_", "."; no "--" or ".." (the hub's
# own rules; "--" also keeps <owner>--<name> directories unambiguous).
REPO_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?(/[A-Za-z0-9]([A-Za-z0-9._-]{0,94}[A-Za-z0-9])?)?$")
# Characters git refuses in a ref name (git-check-ref-format), plus anything a shell or path reads.
_REF_BAD_RE = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
# vLLM units run with PrivateTmp=yes: their /tmp and /var/tmp are private and empty.
PRIVATE_TMP = ("/tmp", "/var/tmp")
# A served name the front proxy can match and list: HAProxy's `-m str` takes space-separated words
# inside a config line, and the name is written into JSON bodies, so no spaces, quotes or escapes.
ROUTABLE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")

Name = Annotated[str, Field(pattern=NAME_RE.pattern)]
DAY = 86_400.0


class _Strict(BaseModel):
    # inf and nan parse as TOML floats; no setting means anything with them.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


SECRET_ADVICE = ("unit files are world-readable, so secrets go in the model's EnvironmentFile "
                 "(<env_dir>/<model>.env, mode 0600), never in deploy.toml")


class _SubKeyError(ValueError):
    """An error below the field pydantic reports (``[1]`` of args, ``.HF_TOKEN`` of env)."""

    def __init__(self, sub: str, message: str) -> None:
        super().__init__(message)
        self.sub = sub


def _no_secret_in(args: tuple[str, ...]) -> None:
    # Before any other check of the same values: those quote the value in their message.
    hit = secret_in_args(args)
    if hit:
        raise _SubKeyError(f"[{hit[0]}]", f"holds {hit[1]} (value not shown): {SECRET_ADVICE}")


def _safe(value: str, what: str) -> str:
    try:
        check_safe_text(value, what)
    except RenderError as exc:  # a ValueError, so pydantic reports it with its key path
        raise ValueError(str(exc)) from None
    return value


def check_revision(value: str) -> str:
    """A commit SHA, a branch or a tag name by git's ref rules: never a path or an option."""
    problem = None
    if not value or len(value) > 255:
        problem = "must be 1 to 255 characters"
    elif value.startswith("-"):
        problem = "must not start with '-'"
    elif _REF_BAD_RE.search(value):
        problem = "contains a character git does not allow in a ref (space, ~ ^ : ? * [ \\ or a control character)"
    elif ".." in value or "@{" in value or "//" in value or value == "@":
        problem = "contains '..', '@{' or '//' (a revision is a commit SHA, branch or tag, never a path)"
    elif value.startswith("/") or value.endswith(("/", ".", ".lock")):
        problem = "must not start with '/' or end with '/', '.' or '.lock'"
    elif any(part.startswith(".") for part in value.split("/")):
        problem = "has a part starting with '.' (a revision is a commit SHA, branch or tag, never a path)"
    if problem:
        raise ValueError(f"revision {shown(value)} {problem}")
    return value


def _outside_private_tmp(path: str, what: str) -> None:
    norm = posixpath.normpath(path)
    for tmp in PRIVATE_TMP:
        if norm == tmp or norm.startswith(tmp + "/"):
            raise ValueError(f"{what} {path} is under {tmp}, which the model's unit cannot see (vLLM units run "
                             f"with PrivateTmp=yes, an empty {tmp} of their own): move it out of /tmp and /var/tmp")


class Defaults(_Strict):
    """Values every model inherits unless it sets its own."""

    user: str = "vllm"
    group: str = "vllm"
    engine: tuple[str, ...] = ("/opt/vllm/bin/vllm", "serve")
    bind: str = "0.0.0.0"
    gpu_memory_utilization: float = Field(0.90, gt=0.0, le=1.0)
    # Upper bounds keep every value a number systemd and the agent's timers accept.
    load_deadline_s: float = Field(900.0, ge=1, le=7 * DAY)
    stop_timeout_s: float = Field(120.0, ge=1, le=DAY)
    free_timeout_s: float = Field(60.0, gt=0, le=DAY)
    health_interval_s: float = Field(0.2, ge=0.01, le=3600)
    restart_sec: float = Field(10.0, ge=0, le=DAY)
    start_limit_burst: int = Field(3, ge=1, le=1000)
    env_dir: str = "/etc/orchestrator/env"
    # Ray's CLI on every node of a model with backend = "ray" (the same Ray version everywhere).
    ray: str = "/opt/vllm/bin/ray"

    @field_validator("user", "group", "bind", "env_dir", "ray")
    @classmethod
    def _safe_text(cls, v: str) -> str:
        return _safe(v, "value")

    @field_validator("user", "group")
    @classmethod
    def _account(cls, v: str) -> str:
        if not USER_RE.match(v):
            raise ValueError(f"{shown(v)} is not a valid user or group name (lower case letters, digits, '_', '-')")
        return v

    @field_validator("env_dir")
    @classmethod
    def _env_dir(cls, v: str) -> str:
        if not PATH_RE.match(v):
            raise ValueError(f"{shown(v)} must be an absolute path without spaces or quotes")
        return v

    @field_validator("engine")
    @classmethod
    def _safe_engine(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _engine(v)


def _engine(v: tuple[str, ...]) -> tuple[str, ...]:
    _no_secret_in(v)
    if not v or not v[0].startswith("/"):
        raise ValueError(f"engine must start with an absolute executable path, got {shown(repr(list(v)))}")
    for arg in v:
        _safe(arg, "engine argument")
        if arg.startswith("/"):
            _outside_private_tmp(arg, "engine path")
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
    gpu_memory_gib: float = Field(80.0, gt=0, le=65536)
    interconnect: Literal["pcie", "nvlink", "unknown"] = "unknown"
    models_dir: str = "/models"
    unit_dir: str = "/etc/systemd/system"
    python: str = "/usr/bin/python3"
    engine: tuple[str, ...] | None = None
    bind: str | None = None  # the address vLLM listens on; defaults.bind when unset
    agent_socket: str | None = None  # a controller's rollout reaches the box's agent here (relay --socket)
    # Multi-node models: the address the other nodes reach this host at (default: address), the
    # network interface Gloo/NCCL use (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME), and the network
    # between boxes (the planner warns when tensor parallel would cross it).
    node_address: str | None = None
    interface: str | None = None
    network: Literal["infiniband", "roce", "ethernet", "unknown"] = "unknown"
    ray: str | None = None  # Ray's CLI on this host; defaults.ray when unset

    @field_validator("address", "ssh_user", "models_dir", "unit_dir", "python", "bind", "agent_socket",
                     "node_address", "interface", "ray")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")

    @field_validator("engine")
    @classmethod
    def _safe_engine(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else _engine(v)

    @property
    def peer_address(self) -> str:
        """Where the other nodes of a multi-node model reach this host."""
        return self.node_address or self.address

    @field_validator("models_dir")
    @classmethod
    def _models_dir_visible(cls, v: str) -> str:
        _outside_private_tmp(v, "models_dir")
        return v


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
    tensor_parallel: int = Field(1, ge=1, le=1024)
    pipeline_parallel: int = Field(1, ge=1, le=1024)
    data_parallel: int = Field(1, ge=1, le=1024)
    expert_parallel: bool = False
    max_model_len: int | None = Field(None, ge=1, le=2**31 - 1)
    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000)
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    load_deadline_s: float | None = Field(None, ge=1, le=7 * DAY)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    allow_patterns: tuple[str, ...] = ()
    ignore_patterns: tuple[str, ...] = ()
    # A local copy of the model's config.json for `plan` (relative to deploy.toml): plans offline.
    config: str | None = None
    # A model larger than one box: the hosts it spans (the first serves the API), ``gpus`` on each,
    # TP inside a node and PP or DP across nodes, with vLLM's own multi-node backend or Ray.
    nodes: tuple[Name, ...] = ()
    backend: Literal["native", "ray"] = "native"
    master_port: int = Field(29500, ge=1, le=65535)  # native: torch.distributed's rendezvous on node 0
    ray_port: int = Field(6379, ge=1, le=65535)  # ray: the head's GCS port

    @field_validator("repo", "revision", "source", "served_name", "config")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, v: str) -> str:
        if not REPO_RE.match(v) or ".." in v or "--" in v:
            raise ValueError(f"repo {shown(v)} is not a Hugging Face repo id ('owner/name': letters, digits, "
                             f"'-', '_', '.'; no '..' or '--')")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return check_revision(v)

    @field_validator("source")
    @classmethod
    def _source_form(cls, v: str) -> str:
        kind, sep, arg = v.partition(":")
        ok = (v in ("hub", "none") or (kind == "local" and arg.startswith("/"))
              or (kind == "host" and bool(NAME_RE.match(arg))))
        if not ok or (kind in ("local", "host") and not sep):
            raise ValueError(f"source {v!r} is not \"hub\", \"none\", \"local:/absolute/dir\" or "
                             "\"host:NAME\" (a host of this file that already staged the model)")
        if v.startswith("local:"):
            _outside_private_tmp(v.removeprefix("local:"), "local weights directory")
        return v

    @field_validator("args")
    @classmethod
    def _safe_args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        _no_secret_in(v)
        for arg in v:
            _safe(arg, "argument")
        return v

    @field_validator("env")
    @classmethod
    def _safe_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            kind = "a secret by its name" if secret_name(key) else secret_value_kind(value)
            if kind:
                raise _SubKeyError(f".{key}", f"holds {kind} (value not shown): {SECRET_ADVICE}")
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"environment variable name {shown(key)} is not a valid name")
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

    @field_validator("nodes")
    @classmethod
    def _nodes_distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({n for n in v if v.count(n) > 1})
        if twice:
            raise ValueError(f"host {twice[0]!r} is listed twice in {list(v)} (each node is one host)")
        if len(v) == 1:
            raise ValueError(f"{list(v)} names one host: a multi-node model spans at least 2 (use host = "
                             f"{v[0]!r} for one box)")
        return v

    @model_validator(mode="after")
    def _layout_matches_gpus(self) -> Model:
        need = self.tensor_parallel * self.pipeline_parallel * self.data_parallel
        if self.nodes:
            have = len(self.gpus) * len(self.nodes)
            if need != have:
                raise ValueError(
                    f"tensor_parallel {self.tensor_parallel} x pipeline_parallel {self.pipeline_parallel} x "
                    f"data_parallel {self.data_parallel} = {need} GPUs, but {len(self.nodes)} nodes x "
                    f"{len(self.gpus)} GPUs each (gpus = {list(self.gpus)}) = {have}")
            if self.host is not None and self.host != self.nodes[0]:
                raise ValueError(f"host {self.host!r} is not the first of nodes {list(self.nodes)} (the first "
                                 "node serves the API; leave host out)")
            return self
        if self.backend == "ray":
            raise ValueError("backend \"ray\" needs nodes = [...] (Ray is used across boxes only)")
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

    @property
    def multinode(self) -> bool:
        return bool(self.nodes)


class Schedule(_Strict):
    """A cron-driven operation: switch to a model, or redeploy what runs."""

    name: Name = ""
    cron: str
    host: Name | None = None
    action: Literal["switch", "redeploy", "stage"] = "switch"
    model: Name | None = None
    window: str | None = None
    # A schedule that comes due while the host is busy is skipped and recorded (the only choice:
    # a queued switch could fire hours late, outside its window).
    on_busy: Literal["skip"] = "skip"
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        return schedule_rules.check_cron(v)

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            schedule_rules.parse_window(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        schedule_rules.parse_zone(v)
        return v

    @model_validator(mode="after")
    def _model_needed(self) -> Schedule:
        if self.action in ("switch", "stage") and not self.model:
            raise ValueError(f"action {self.action!r} needs a model")
        return self


class Policy(_Strict):
    """What the agent does on its own."""

    rollback_on_failure: bool = True
    watch_interval_s: float = Field(15.0, ge=0.01, le=DAY)
    unhealthy_after_s: float = Field(60.0, gt=0, le=7 * DAY)
    on_unhealthy: Literal["restart", "rollback", "record"] = "restart"
    smoke_bench: bool = False
    min_tok_s_ratio: float | None = Field(None, gt=0, le=1)
    keep_revisions: int = Field(2, ge=1, le=1000)


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
    def _no_inline_secret(self) -> Catalog:
        found = scan(self.model_dump())
        if found:
            path, what = found
            raise _KeyedError(path, f"holds {what} (value not shown): {SECRET_ADVICE}")
        return self

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
            for node in model.nodes:
                if node not in self.hosts:
                    raise _KeyedError(f"models.{name}.nodes",
                                      f"unknown host {node!r} (known: {', '.join(sorted(self.hosts))})")
            for host in self.model_hosts(name):
                too_high = [g for g in model.gpus if g >= host.gpus]
                if too_high:
                    raise _KeyedError(f"models.{name}.gpus",
                                      f"GPU index {too_high[0]} is out of range: host {host.name} has "
                                      f"{host.gpus} GPUs (0-{host.gpus - 1})")
                if model.nodes and model.tensor_parallel > host.gpus:
                    raise _KeyedError(f"models.{name}.tensor_parallel",
                                      f"tensor_parallel {model.tensor_parallel} is larger than node "
                                      f"{host.name}'s {host.gpus} GPUs: keep TP inside a box and use "
                                      "pipeline_parallel or data_parallel across nodes")
        seen: dict[tuple[str, int], str] = {}
        for name, model in self.models.items():
            for host in self.model_hosts(name):
                key = (host.name, model.port)
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
                raise _KeyedError(f"schedules.{name}.host",
                                  f"unknown host {sched.host!r} (known: {', '.join(sorted(self.hosts))})")
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

    def model(self, name: str) -> Model:
        """The model called ``name``, or the one UsageError that lists the known ones."""
        if name not in self.models:
            raise UsageError(f"unknown model {name!r} (known: {', '.join(sorted(self.models)) or 'none'})")
        return self.models[name]

    def host(self, name: str) -> Host:
        """The host called ``name``, or the one UsageError that lists the known ones."""
        if name not in self.hosts:
            raise UsageError(f"unknown host {name!r} (known: {', '.join(sorted(self.hosts)) or 'none'})")
        return self.hosts[name]

    def only_host(self) -> Host:
        """The single host, for commands that may leave --host out; else a UsageError naming them."""
        if len(self.hosts) != 1:
            raise UsageError(f"there are {len(self.hosts)} hosts: say which one with --host "
                             f"({', '.join(sorted(self.hosts))})")
        return next(iter(self.hosts.values()))

    def model_hosts(self, model: str) -> list[Host]:
        """Every host a model runs on: its group's hosts (one replica each), its nodes (one engine
        across them, the API's first), else its one host."""
        spec = self.models[model]
        if spec.group is not None:
            return [self.hosts[h] for h in self.groups[spec.group].hosts]
        return self.nodes_of(model)

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
        """The host a model runs on (a multi-node model: its first node, which serves the API)."""
        spec = self.models[model]
        if spec.nodes and spec.nodes[0] in self.hosts:
            return self.hosts[spec.nodes[0]]
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

    def nodes_of(self, model: str) -> list[Host]:
        """Every host a model runs on, the API's first."""
        spec = self.models[model]
        if spec.nodes:
            return [self.hosts[n] for n in spec.nodes if n in self.hosts]
        return [self.model_host(model)]

    def models_on(self, host: str) -> list[str]:
        return [m for m in self.models if host in (h.name for h in self.model_hosts(m))]

    def engine_for(self, host: Host) -> tuple[str, ...]:
        return host.engine or self.defaults.engine


class _KeyedError(ValueError):
    """A cross-reference error that knows its key path (pydantic would only say 'value_error')."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
