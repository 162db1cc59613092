"""The models of deploy.toml as validated data: what each engine serves, on which GPUs
and with which layout, its arguments and environment, its sleep level."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from orchestrator.core.catalog_rules import (
    DAY,
    ENV_KEY_RE,
    MAX_UNIT_LINE,
    NAME_RE,
    REPO_RE,
    ROUTABLE_RE,
    SECRET_ADVICE,
    SERVED_NAME_ADVICE,
    SHA_RE,
    Name,
    Strict,
    SubKeyError,
    check_revision,
    no_secret_in,
    outside_private_tmp,
    safe,
)
from orchestrator.core.ray_start import FIXED as RAY_FIXED
from orchestrator.core.ray_start import FROM_KEYS as RAY_FROM_KEYS
from orchestrator.core.safety import shown
from orchestrator.engines import ENGINE, ENGINES, Engine, engine_named
from orchestrator.secrets import secret_name, secret_value_kind

# Keys the unit renders a flag for only when they are set: unset, the flag may come through args
# (adopt carries `--max-model-len 32k` there, a value the integer key cannot hold).
_KEYED_WHEN_SET = frozenset({"max_model_len", "max_num_seqs"})
# Where a multi-node model's per-node flags (the engine's node_args, and what a Ray head's engine adds)
# take their values from: the key to set instead.
NODE_KEYS = {
    "nodes": "the model's `nodes` (their count)",
    "rank": "the model's `nodes` (their order: the first serves the API, the others run headless)",
    "head_address": "the first node's address (its host's node_address, else address)",
    "port": "the model's `master_port`",
    "data_parallel_local": "the model's `data_parallel` over its `nodes`",
    "backend": 'the model\'s `backend` ("native" or "ray")',
}


def _read_as(engine: Engine, arg: str, flag: str) -> str:
    """The argument as written, and the flag the engine's parser reads it as when that differs."""
    said = arg.split("=", 1)[0]
    return shown(arg) if said == flag else f"{shown(arg)} ({engine.title}'s parser reads it as {flag})"


def _engine_of(info: ValidationInfo) -> Engine:
    """The engine of the model a field validator checks (its `engine_name`, validated before the other
    keys); the default engine where that key itself was refused."""
    name = info.data.get("engine_name")
    return ENGINES.get(name, ENGINE) if isinstance(name, str) else ENGINE


class Model(Strict):
    """One servable model: where its weights come from and how its engine runs it."""

    name: Name = ""
    # The inference engine that runs the model (one of orchestrator.engines.ENGINES): its unit, command
    # line, sleep mode and the planner's rules are that engine's. Declared first: other keys' checks ask it.
    engine_name: str = ENGINE.name
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
    # TP inside a node and PP or DP across nodes, with the engine's own multi-node backend or Ray.
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

    @field_validator("engine_name")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        if v not in ENGINES:
            raise ValueError(f"engine {shown(v)} is not known (known: {', '.join(sorted(ENGINES))})")
        return v

    @field_validator("repo", "revision", "source", "served_name", "config")
    @classmethod
    def _safe_text(cls, v: str | None) -> str | None:
        return None if v is None else safe(v, "value")

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, v: str | None) -> str | None:
        # Always, not only with the proxy on: the name is a --served-model-name word in the unit.
        if v is not None and not ROUTABLE_RE.fullmatch(v):
            quoted = shown(v) if len(v) <= 60 else f"{shown(v[:60])}... ({len(v):,} characters)"
            raise ValueError(f"{quoted} cannot be routed by the front proxy nor named in a unit: {SERVED_NAME_ADVICE}")
        return v

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, v: str) -> str:
        if not REPO_RE.fullmatch(v) or ".." in v or "--" in v:
            raise ValueError(
                f"repo {shown(v)} is not a Hugging Face repo id ('owner/name': letters, digits, "
                f"'-', '_', '.'; no '..' or '--')"
            )
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        return check_revision(v)

    @field_validator("source")
    @classmethod
    def _source_form(cls, v: str) -> str:
        kind, sep, arg = v.partition(":")
        ok = (
            v in ("hub", "none")
            or (kind == "local" and arg.startswith("/"))
            or (kind == "host" and bool(NAME_RE.fullmatch(arg)))
        )
        if not ok or (kind in ("local", "host") and not sep):
            raise ValueError(
                f'source {v!r} is not "hub", "none", "local:/absolute/dir" or '
                '"host:NAME" (a host of this file that already staged the model)'
            )
        if v.startswith("local:"):
            directory = v.removeprefix("local:")
            if {".", ".."} & set(directory.split("/")):  # the unit runs the engine on it: say the real path
                raise ValueError(
                    f"source {shown(v)}: the local weights directory has a '.' or '..' part: name the real path"
                )
            outside_private_tmp(directory, "local weights directory")
        return v

    @field_validator("args", "ray_args")
    @classmethod
    def _safe_args(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        engine = _engine_of(info)
        no_secret_in(v)
        for i, arg in enumerate(v):
            safe(arg, "argument")
            flag = arg.split("=", 1)[0]
            # its parser's other spellings: a unique prefix (--enable-sleep), underscores (--enable_sleep_mode)
            meant = engine.flag_read_as(arg, engine.sleep_flags)
            if meant is not None:
                said = "" if flag == meant else f" ({engine.title}'s parser reads it as {meant})"
                raise SubKeyError(
                    f"[{i}]",
                    f"{shown(arg)}{said}: sleep mode is the model's `sleep` setting "
                    '("level1" or "level2"), which also renders this flag',
                )
        total = sum(len(a) + 1 for a in v)
        if total > MAX_UNIT_LINE:  # one ExecStart line: systemd refuses lines past LONG_LINE_MAX
            raise ValueError(
                f"{len(v)} arguments of {total:,} characters in all: at most {MAX_UNIT_LINE:,} fit "
                "on the unit's ExecStart line"
            )
        return v

    @field_validator("allow_patterns", "ignore_patterns")
    @classmethod
    def _patterns_inside(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # Globs over the repo's own files: nothing absolute, nothing that climbs out of the model's directory.
        for i, pattern in enumerate(v):
            safe(pattern, "pattern")
            if pattern.startswith("/") or ".." in pattern.split("/"):
                raise SubKeyError(
                    f"[{i}]",
                    f"{shown(pattern)}: a pattern names files inside the model's repo "
                    "('*.safetensors', 'tokenizer*'): no leading '/' and no '..' part",
                )
        return v

    @field_validator("env")
    @classmethod
    def _safe_env(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        engine = _engine_of(info)
        for key, value in v.items():
            kind = "a secret by its name" if secret_name(key) else secret_value_kind(value)
            if kind:
                raise SubKeyError(f".{key}", f"holds {kind} (value not shown): {SECRET_ADVICE}")
            if not ENV_KEY_RE.fullmatch(key):
                raise ValueError(f"environment variable name {shown(key)} is not a valid name")
            # Set by rendering for sleep-enabled models only: here it would bypass `sleep` (its loopback
            # bind and the proxy's deny of the control endpoints).
            if key in engine.dev_mode_env:
                raise SubKeyError(
                    f".{key}",
                    f"{key} = {shown(value)} would open {engine.title}'s dev endpoints "
                    "(/collective_rpc, /sleep ...) without the product's guards: set "
                    'sleep = "level1" or "level2" instead, which turns it on',
                )
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
            raise ValueError(
                f"{list(v)} names one host: a multi-node model spans at least 2 (use host = {v[0]!r} for one box)"
            )
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
                    f"{len(self.gpus)} GPUs each (gpus = {list(self.gpus)}) = {have}"
                )
            if self.host is not None and self.host != self.nodes[0]:
                raise ValueError(
                    f"host {self.host!r} is not the first of nodes {list(self.nodes)} (the first "
                    "node serves the API; leave host out)"
                )
            return self
        if self.backend == "ray":
            raise ValueError('backend "ray" needs nodes = [...] (Ray is used across boxes only)')
        if need != len(self.gpus):
            raise ValueError(
                f"tensor_parallel {self.tensor_parallel} x pipeline_parallel {self.pipeline_parallel} x "
                f"data_parallel {self.data_parallel} = {need} GPUs, but gpus lists {len(self.gpus)}: "
                f"{list(self.gpus)}"
            )
        return self

    @model_validator(mode="after")
    def _args_not_rendered(self) -> Model:
        # A flag the unit already renders from a key, given again in args, wins (the engine's parser takes
        # the last): the engine would listen, serve or lay out otherwise than every check believes.
        engine = self.engine
        keyed = {**engine.rendered_flags.keyed, **engine.rendered_flags.switches}
        for i, arg in enumerate(self.args):
            flag = engine.flag_read_as(arg, keyed)
            if flag is None or (keyed[flag] in _KEYED_WHEN_SET and getattr(self, keyed[flag]) is None):
                continue
            key = keyed[flag]
            where = {
                "bind": "defaults.bind (or the host's bind)",
                "model": "the model's source (or the host's models_dir)",
            }.get(key, f"the model's `{key}`")
            raise SubKeyError(
                f".args[{i}]",
                f"{_read_as(engine, arg, flag)}: the unit renders {flag} from {where}: set it "
                f"there (a second {flag} in args would override it behind the product's "
                "checks)",
            )
        return self

    @model_validator(mode="after")
    def _args_not_node_rendered(self) -> Model:
        # Every node's unit of a multi-node model renders its place among the nodes (and a Ray head's engine
        # the backend): repeated in args, which every node runs, each rank would claim another's place.
        if not self.nodes:
            return self
        engine, node = self.engine, self.engine.rendered_flags.node
        for i, arg in enumerate(self.args):
            flag = engine.flag_read_as(arg, node)
            if flag is not None:
                raise SubKeyError(
                    f".args[{i}]",
                    f"{_read_as(engine, arg, flag)}: model {self.name} spans nodes "
                    f"{list(self.nodes)}, whose units render {flag} for each node "
                    f"from {NODE_KEYS[node[flag]]}: set that instead",
                )
        return self

    @field_validator("ray_args")
    @classmethod
    def _ray_args_not_rendered(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # `ray start` (click) takes the last of a repeated option: these would move a node off what
        # core/multinode renders and what the switch waits on (the head's port, the node's address, its GPUs).
        for i, arg in enumerate(v):
            flag = arg.split("=", 1)[0]
            if flag in RAY_FROM_KEYS:
                raise SubKeyError(
                    f"[{i}]", f"{shown(arg)}: the Ray units render {flag} from {RAY_FROM_KEYS[flag]}: set it there"
                )
            if flag in RAY_FIXED:
                raise SubKeyError(
                    f"[{i}]",
                    f"{shown(arg)}: the Ray units render {flag} themselves "
                    f"({RAY_FIXED[flag]}): ray_args cannot change it",
                )
        return v

    @model_validator(mode="after")
    def _idle_order(self) -> Model:
        if self.idle_sleep_s is not None and self.idle_stop_s is not None and self.idle_stop_s < self.idle_sleep_s:
            raise SubKeyError(
                ".idle_stop_s",
                f"idle_stop_s {self.idle_stop_s:g} is less than idle_sleep_s "
                f"{self.idle_sleep_s:g}: a model is stopped after it has slept, so "
                "idle_stop_s counts from the last request too and must be the larger",
            )
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
    def engine(self) -> Engine:
        """The engine that runs it (`engine_name`)."""
        return engine_named(self.engine_name)

    @property
    def unit_name(self) -> str:
        return self.engine.unit_name(self.name)

    @property
    def pinned(self) -> bool:
        return bool(SHA_RE.fullmatch(self.revision))

    @property
    def multinode(self) -> bool:
        return bool(self.nodes)
