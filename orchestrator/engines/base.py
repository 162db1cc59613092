"""The engine interface: ``Engine`` (one kind of inference engine) and ``Launch`` (what it starts)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.engines.shapes import Findings, ModelSpec


@dataclass(frozen=True)
class SleepApi:
    """The HTTP paths of an engine's sleep mode (adapters/engine_http.py calls them)."""

    sleep: str  # POST ?level=N&mode=M
    wake: str  # POST, ?tags=... for part of the engine
    is_sleeping: str  # GET: {"is_sleeping": bool}
    reload_weights: str  # POST {"method": "reload_weights"}: level 2's weights back
    reset_prefix_cache: str  # POST: the last step of a level-2 wake


@dataclass(frozen=True)
class LoadRules:
    """What an engine's loader demands of a layout and of GPU memory: the engine's facts the planner
    (core/planner*.py: the model's shapes and the arithmetic) asks instead of assuming them."""

    overhead_gib: float  # what its profiling run finds besides weights and KV cache (activations, graphs, NCCL)
    max_num_seqs: int  # its scheduler's default cap (not a memory demand)
    gpu_memory_utilization: float  # its default share of each GPU
    min_full_sequences: int  # the KV cache must hold this many max_model_len sequences, or it refuses to start
    kv_rule: str  # where it refuses a KV cache too small (cited in the planner's reason)
    start_rule: str  # where it refuses to start without utilization x total free (cited)
    long_context: str  # what it does with max_model_len over max_position_embeddings
    expert_parallel: str | None  # how a fix turns expert parallel on (its flag); None: the engine has none

    def ep_size(self, tp: int, dp: int) -> int:
        """The ranks experts are spread over with expert parallel."""
        return tp * dp

    def moe_split(self, tp: int, dp: int, ep: bool) -> int:
        """The ranks each expert's weights are split over: with expert parallel none (whole experts
        per rank), without it every TP rank of every DP replica."""
        return 1 if ep else tp * dp

    def start_need_gib(self, gpu_memory_gib: float, utilization: float) -> float:
        """The free memory a GPU must have for the engine to start on it."""
        return gpu_memory_gib * utilization


@dataclass(frozen=True)
class RenderedFlags:
    """The flags an engine's units write themselves, each with what it carries: a model's own ``args``
    (last on the command line, where the engine's parser takes the last of a repeated flag) must not say
    one again, or the engine would run otherwise than every check believes."""

    keyed: Mapping[str, str]  # flag (its short forms too) -> the deploy.toml key whose value it carries
    switches: Mapping[str, str]  # flag without a value -> the boolean deploy.toml key that writes it
    # A multi-node model's units only: flag -> what it carries, a parameter of Engine.node_args ("nodes",
    # "rank", "head_address", "port", "data_parallel_local"), or "backend" for what ray_args writes.
    node: Mapping[str, str]
    # What the engine takes for a key its flag leaves out: adopt states it (--port 8000) so a found command
    # line and the unit rendered from its entry read the same.
    defaults: Mapping[str, str] = field(default_factory=dict)

    def long(self, key: str) -> str:
        """The long flag written for ``key`` (``tensor_parallel`` -> ``--tensor-parallel-size``)."""
        return next(f for f, k in self.keyed.items() if k == key and f.startswith("--"))


@dataclass(frozen=True)
class Option:
    """One option of a command line as written."""

    flag: str
    value: str | None  # None: a boolean flag
    words: tuple[str, ...]  # as written: ("--port", "8000"), ("--port=8000",) or ("--enforce-eager",)


class CommandLine(Protocol):
    """Reading a command line of the engine's server as written (adopt: an engine found running)."""

    @property
    def marker(self) -> str:
        """A word every command line of its server holds (adopt's first, cheap filter of processes)."""
        ...

    @property
    def forms(self) -> str:
        """How its server's command line starts, for messages."""
        ...

    def engine_length(self, argv: tuple[str, ...] | list[str]) -> int | None:
        """How many leading words start the server; None: not this engine's."""
        ...

    def engine_words(self, argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """Those words as a model entry's ``engine`` names them."""
        ...

    def options(self, words: tuple[str, ...] | list[str]) -> tuple[str | None, list[Option], list[str]]:
        """(the positional model, the flags in order each as written, the words that are neither)."""
        ...

    def pairs(self, argv: tuple[str, ...] | list[str], label: str = "argv") -> list[tuple[str, str | None]]:
        """The flag/value pairs, sorted by flag: what two command lines that mean the same share."""
        ...


@dataclass(frozen=True)
class Launch:
    """What an engine needs to start one model (or one node's rank of it), from the catalog."""

    command: tuple[str, ...]  # the engine's own command line (deploy.toml's `engine`)
    model_dir: str  # the staged weights
    served: str  # the name clients ask for
    bind: str  # the address it listens on
    port: int
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False
    sleep: bool = False  # sleep mode on (the model has `sleep`)
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    gpus: tuple[int, ...] = ()
    load_deadline_s: float = 600.0
    args: tuple[str, ...] = field(default=())  # the model's own arguments, last


class Engine(Protocol):
    """One kind of inference engine (vLLM), as the product starts, watches and controls it."""

    @property
    def name(self) -> str:
        """Its name in configuration and messages: "vllm"."""
        ...

    @property
    def title(self) -> str:
        """How units and messages name it: "vLLM"."""
        ...

    @property
    def template(self) -> str:
        """Its systemd unit template under templates/: "vllm.service.j2"."""
        ...

    @property
    def default_command(self) -> tuple[str, ...]:
        """deploy.toml's `engine` when it says none: the command line as the README installs it."""
        ...

    @property
    def env_prefixes(self) -> tuple[str, ...]:
        """The prefixes of its own environment variables (adopt keeps them from a hand-run process's)."""
        ...

    @property
    def deadline_env(self) -> str | None:
        """The variable the unit sets to the load deadline (the engine's own start timeout); None: none."""
        ...

    @property
    def api_key_env(self) -> str | None:
        """The variable it reads its API key from (never on a command line); None: none."""
        ...

    @property
    def module_command(self) -> tuple[str, ...]:
        """Its server as its Python interpreter's arguments (doctor's advice for a full check)."""
        ...

    @property
    def default_user(self) -> str:
        """The account (and group) its units run as by default."""
        ...

    @property
    def default_ray(self) -> str:
        """Ray's CLI where the engine's install puts it (a multi-node model with backend ray)."""
        ...

    @property
    def control_paths(self) -> tuple[str, ...]:
        """HTTP paths that control the engine: never forwarded by the proxy."""
        ...

    @property
    def dev_mode_env(self) -> tuple[str, ...]:
        """Environment that opens those paths: set by rendering only."""
        ...

    @property
    def sleep_flags(self) -> tuple[str, ...]:
        """Arguments that turn sleep mode on or off: set by rendering only."""
        ...

    @property
    def rendered_flags(self) -> RenderedFlags:
        """The flags its units write from a model's keys (one node's and a multi-node model's per-node ones)."""
        ...

    @property
    def command_line(self) -> CommandLine:
        """How its server's command line reads (adopt)."""
        ...

    def flag_read_as(self, word: str, flags: Iterable[str]) -> str | None:
        """The flag among ``flags`` its parser reads the argument ``word`` as (another spelling, a prefix
        it completes, ``=value`` attached), else None."""
        ...

    @property
    def sleep_api(self) -> SleepApi:
        """Its sleep mode's HTTP paths (each one among control_paths)."""
        ...

    @property
    def load_rules(self) -> LoadRules:
        """What its loader demands of a layout and of GPU memory (the planner asks)."""
        ...

    def shape_rules(self, m: ModelSpec, tp: int, pp: int, dp: int, ep: bool) -> Findings:
        """Why its loader refuses (reasons) or warns about (warnings) building ``m`` for the layout
        (heads, vocabulary, MLP and expert blocks, pipeline stages), each naming the numbers."""
        ...

    def kv_bytes_per_token(self, m: ModelSpec, tp: int, pp: int, kv_cache_dtype: str) -> tuple[float, float]:
        """Its KV cache's bytes per token on one GPU: (full-attention layers, sliding-window layers)."""
        ...

    def sleep_level(self, level: str) -> int:
        """The level its sleep API takes for a model's `sleep` ("level1" -> 1, "level2" -> 2)."""
        ...

    def sleep_keeps_weights(self, level: str) -> bool:
        """Whether a sleeper at ``level`` keeps its weights in host RAM (level1) or drops them (level2)."""
        ...

    @property
    def probe_script(self) -> str:
        """Python run with the engine's interpreter (doctor): prints "version V", then "flag F" per option
        its server knows (or "noflags REASON")."""
        ...

    @property
    def ray_args(self) -> tuple[str, ...]:
        """What makes the engine on a Ray head use the Ray cluster (a multi-node model with backend ray)."""
        ...

    @property
    def health_path(self) -> str:
        """Answers 200 when the server is up (not proof that a request succeeds)."""
        ...

    @property
    def models_path(self) -> str:
        """Lists the served model names."""
        ...

    @property
    def completions_path(self) -> str:
        """One real completion: the readiness that counts."""
        ...

    def unit_name(self, model: str) -> str:
        """The systemd unit that runs ``model``."""
        ...

    def owns_cgroup(self, cgroup: bytes) -> bool:
        """Whether a process whose /proc/PID/cgroup reads ``cgroup`` runs in one of this engine's units."""
        ...

    def argv(self, launch: Launch) -> list[str]:
        """The full command line: the engine's command, the layout flags, then the model's own args."""
        ...

    def environment(self, launch: Launch) -> dict[str, str]:
        """The environment the unit sets for it (GPUs, start deadline, sleep mode's endpoints)."""
        ...

    def platform(self, command: Sequence[str]) -> str:
        """What ``command`` runs on when the host does not say: "cpu" or "cuda"."""
        ...

    def sleeps(self, unit_text: str) -> bool:
        """Whether a rendered unit runs the engine with sleep mode."""
        ...

    def node_args(
        self, *, nodes: int, rank: int, head_address: str, port: int, data_parallel_local: int | None = None
    ) -> tuple[str, ...]:
        """A node's rank of a multi-node model (native backend): its place among ``nodes``; with
        ``data_parallel_local``, data parallel across nodes, that many replicas on each."""
        ...

    def node_env(self, peer_address: str) -> dict[str, str]:
        """What the engine on a node needs to find the others (besides the NCCL/Gloo interface)."""
        ...

    def flags_needed(self, *, sleep: bool, expert_parallel: bool) -> list[str]:
        """The flags a model with these features needs the installed engine to know (doctor asks it)."""
        ...

    def reason(self, line: str) -> tuple[str, str] | None:
        """(error type, message) when a log line carries the engine's own reason for failing."""
        ...
