"""Hardware-aware preflight: can this model load with this parallel layout on these GPUs?

Pure: takes a parsed ``config.json`` (any mapping), a layout, the host's GPUs and the workload, and
returns a Verdict with every reason (each naming the numbers and the engine's source it mirrors), or
the valid layouts best first. It never raises on a config: garbage, truncated or unknown configs
give a clean verdict (invalid with a reason when the shapes needed to decide are missing; unknown
architectures get the generic checks plus a warning). See planner_memory.py for the memory math.
What the engine's loader demands the planner asks the engine (``engine=`` of check, layouts and plan;
the default engine unless given): its shape rules (``Engine.shape_rules``), its KV cache's bytes per
token (``Engine.kv_bytes_per_token``), its memory rules, its defaults, whether and how it spreads
experts (``Engine.load_rules``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.core.planner_arch import parse_model
from orchestrator.core.planner_memory import (
    GIB,
    check_disk,
    estimate_weight_bytes,
    weight_bytes_from_headers,
    weight_bytes_from_index,
    weights_per_gpu,
)
from orchestrator.engines import ENGINE, Engine, LoadRules
from orchestrator.engines.shapes import ModelSpec

__all__ = [
    "Hardware",
    "Layout",
    "Memory",
    "Plan",
    "Verdict",
    "Workload",
    "check",
    "check_disk",
    "describe_model",
    "estimate_weight_bytes_from_config",
    "layouts",
    "plan",
    "weight_bytes_from_headers",
    "weight_bytes_from_index",
]

_MAX_ENUMERATED_GPUS = 64  # beyond this, layouts() only tries powers of two


@dataclass(frozen=True)
class Layout:
    """A parallel layout: GPUs needed = tp * pp * dp; with ep, experts spread over the engine's EP size
    (``LoadRules.ep_size``: tp * dp)."""

    tp: int
    pp: int = 1
    dp: int = 1
    ep: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        parts = [f"TP={self.tp}"] + [f"{n}={v}" for n, v in (("PP", self.pp), ("DP", self.dp)) if v != 1]
        return " + ".join(parts + (["EP"] if self.ep else []))

    def phrase(self) -> str:
        """How a fix names it: "TP=8 with expert parallel"."""
        base = " + ".join(str(self).split(" + ")[:-1]) if self.ep else str(self)
        return f"{base} with expert parallel" if self.ep else base

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "ep": self.ep, "gpus": self.gpus, "name": str(self)}


@dataclass(frozen=True)
class Hardware:
    gpu_count: int  # per node
    gpu_memory_gib: float
    free_memory_gib: tuple[float, ...] | None = None  # per GPU index, when probed
    interconnect: str | None = None  # "nvlink" | "pcie", inside a box
    nodes: int = 1  # boxes of gpu_count GPUs each (a multi-node model)
    network: str | None = None  # between boxes: "infiniband" | "roce" | "ethernet"

    @property
    def total_gpus(self) -> int:
        return self.gpu_count * self.nodes

    def __str__(self) -> str:
        # nvidia-smi's MiB / 1024 is 95.5928...: one decimal, and none for a whole number
        box = f"{self.gpu_count} x {f'{self.gpu_memory_gib:.1f}'.removesuffix('.0')} GiB"
        return box if self.nodes == 1 else f"{self.nodes} nodes x {box}"


_DEFAULTS = ENGINE.load_rules  # Workload's defaults: the default engine's


@dataclass(frozen=True)
class Workload:
    """What the KV cache must hold. max_model_len None means the model's max_position_embeddings.

    The engine refuses to start unless the KV cache holds ``LoadRules.min_full_sequences`` full-length
    sequences (the default engine's: one); set min_full_sequences higher to demand room for that many concurrent
    full-length requests. overhead_gib covers what the engine's profiling run finds besides weights and
    KV cache (activation peak, CUDA graphs, NCCL buffers, CUDA context).
    """

    max_model_len: int | None = None
    max_num_seqs: int = _DEFAULTS.max_num_seqs  # the scheduler's cap; not a memory demand
    min_full_sequences: int = _DEFAULTS.min_full_sequences
    gpu_memory_utilization: float = _DEFAULTS.gpu_memory_utilization
    kv_cache_dtype: str = "auto"
    overhead_gib: float = _DEFAULTS.overhead_gib


@dataclass(frozen=True)
class Memory:
    """Per-GPU memory on the busiest GPU, in GiB."""

    weights_gib: float
    weights_source: str  # "index" (real bytes) | "config estimate"
    kv_cache_gib: float  # for min_full_sequences full-length sequences
    kv_bytes_per_token: float
    overhead_gib: float
    required_gib: float
    budget_gib: float  # gpu_memory * utilization
    max_full_sequences: int  # full-length sequences the remaining budget holds
    max_model_len: int

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Verdict:
    layout: Layout
    valid: bool
    reasons: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    memory: Memory | None = None
    fix: str | None = None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.to_dict(),
            "valid": self.valid,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "memory": self.memory.to_dict() if self.memory else None,
            "fix": self.fix,
            "why": self.why,
        }


@dataclass(frozen=True)
class Plan:
    requested: Verdict
    layouts: tuple[Verdict, ...]  # valid ones, best first
    model: Mapping[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return self.requested.valid

    @property
    def fix(self) -> str | None:
        return self.requested.fix

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "reasons": list(self.requested.reasons),
            "warnings": list(self.requested.warnings),
            "fix": self.fix,
            "requested": self.requested.to_dict(),
            "layouts": [v.to_dict() for v in self.layouts],
            "model": dict(self.model),
        }


def estimate_weight_bytes_from_config(config: Mapping[str, Any]) -> int | None:
    """Weight bytes estimated from the config's shapes and quantization, when there is no index."""
    return estimate_weight_bytes(parse_model(_as_mapping(config)))


def describe_model(config: Mapping[str, Any]) -> dict[str, Any]:
    m = parse_model(_as_mapping(config))
    return _describe(m)


def _describe(m: ModelSpec) -> dict[str, Any]:
    return {
        "architecture": m.architecture,
        "family": m.family,
        "attention": "MLA" if m.is_mla else "GQA",
        "layers": m.num_layers,
        "heads": m.num_heads,
        "kv_heads": m.num_kv_heads,
        "experts": m.num_experts,
        "quantization": m.quant.label,
    }


def _as_mapping(config: object) -> Mapping[str, Any]:
    return config if isinstance(config, Mapping) else {}


def _hardware_reasons(
    layout: Layout, hw: Hardware, wl: Workload, devices: Sequence[int] | None, reasons: list[str], rules: LoadRules
) -> None:
    """Checks on the layout numbers, the GPU count and indices, and the GPUs' free memory."""
    for name, value in (("TP", layout.tp), ("PP", layout.pp), ("DP", layout.dp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            reasons.append(f"{name} must be a positive integer (got {value!r})")
    if not 0 < wl.gpu_memory_utilization <= 1:
        reasons.append(f"gpu_memory_utilization must be in (0, 1] (got {wl.gpu_memory_utilization})")
    if reasons:
        return
    if layout.gpus > hw.total_gpus:
        where = "the host has" if hw.nodes == 1 else f"{hw.nodes} nodes x {hw.gpu_count} GPUs have"
        reasons.append(
            f"{layout} needs {layout.gpus} GPUs (TP {layout.tp} x PP {layout.pp} x DP "
            f"{layout.dp}) but {where} {hw.total_gpus}"
        )
        return
    if hw.nodes > 1:
        _node_reasons(layout, hw, reasons)
        if reasons:
            return
    used = list(devices) if devices is not None else list(range(layout.gpus))
    if devices is not None:
        bad = [i for i in used if not 0 <= i < hw.gpu_count]
        if bad:
            reasons.append(f"GPU indices {bad} do not exist on a host with {hw.gpu_count} GPUs")
        if len(set(used)) != len(used):
            reasons.append(f"GPU indices {used} repeat a GPU")
        if len(used) != layout.gpus:
            reasons.append(f"{layout} needs {layout.gpus} GPUs but {len(used)} indices were given: {used}")
    if hw.free_memory_gib is not None:
        # The engine's start rule (rules.start_rule: free memory covers utilization x total).
        want = rules.start_need_gib(hw.gpu_memory_gib, wl.gpu_memory_utilization)
        short = [
            (i, hw.free_memory_gib[i])
            for i in used
            if 0 <= i < len(hw.free_memory_gib) and hw.free_memory_gib[i] < want
        ]
        for i, free in short:
            reasons.append(
                f"GPU {i} has {free:.1f} GiB free, less than gpu_memory_utilization "
                f"{wl.gpu_memory_utilization} x {hw.gpu_memory_gib:.1f} GiB = {want:.1f} GiB"
            )


def _node_reasons(layout: Layout, hw: Hardware, reasons: list[str]) -> None:
    """A layout across nodes: the same share on every node, TP inside a box where it can be."""
    if layout.gpus % hw.nodes:
        reasons.append(f"{layout} needs {layout.gpus} GPUs, which do not split evenly over {hw.nodes} nodes")
    elif layout.tp <= hw.gpu_count and hw.gpu_count % layout.tp and layout.tp % hw.gpu_count:
        reasons.append(
            f"TP {layout.tp} does not divide a node's {hw.gpu_count} GPUs: a TP group would straddle two boxes"
        )
    elif layout.tp > hw.gpu_count and layout.tp % hw.gpu_count:
        reasons.append(f"TP {layout.tp} is not a multiple of a node's {hw.gpu_count} GPUs")


def _node_warnings(layout: Layout, hw: Hardware) -> list[str]:
    if hw.nodes == 1 or layout.tp <= hw.gpu_count:
        return []
    net = hw.network if hw.network and hw.network != "unknown" else "an unknown network"
    return [
        (
            f"TP {layout.tp} crosses boxes ({hw.gpu_count} GPUs per node): every layer's all-reduce goes "
            f"over {net} between nodes; prefer TP {hw.gpu_count} inside a box and PP or DP across nodes"
        )
    ]


def _memory(
    m: ModelSpec,
    layout: Layout,
    hw: Hardware,
    wl: Workload,
    weight_bytes: int | None,
    reasons: list[str],
    warnings: list[str],
    engine: Engine,
) -> Memory | None:
    rules = engine.load_rules
    weights = weights_per_gpu(m, layout.tp, layout.pp, layout.dp, layout.ep, weight_bytes, rules)
    if weights is None:
        warnings.append(
            "memory not checked: no weight size (no safetensors index, and the config lacks the shapes to estimate it)"
        )
        return None
    max_len = wl.max_model_len or m.max_position_embeddings
    if max_len is None or max_len <= 0:
        warnings.append("KV cache not checked: no max_model_len and the config has no max_position_embeddings")
        max_len = 0
    elif m.max_position_embeddings and max_len > m.max_position_embeddings:
        warnings.append(
            f"max_model_len {max_len} exceeds max_position_embeddings {m.max_position_embeddings}; {rules.long_context}"
        )
    full, sliding = engine.kv_bytes_per_token(m, layout.tp, layout.pp, wl.kv_cache_dtype)
    per_seq = full * max_len + sliding * min(m.sliding_window or 0, max_len)
    seqs = max(wl.min_full_sequences, 1)
    budget = hw.gpu_memory_gib * wl.gpu_memory_utilization
    kv_gib = per_seq * seqs / GIB
    weights_gib = weights / GIB
    required = weights_gib + wl.overhead_gib + kv_gib
    room = budget - weights_gib - wl.overhead_gib
    fits = int(room * GIB // per_seq) if per_seq > 0 and room > 0 else 0
    source = "index" if weight_bytes is not None else "config estimate"
    if weights_gib + wl.overhead_gib > budget:
        reasons.append(
            f"weights need {weights_gib:.1f} GiB per GPU ({source}) + {wl.overhead_gib:.1f} GiB "
            f"runtime overhead, over the budget of {budget:.1f} GiB "
            f"({wl.gpu_memory_utilization} x {hw.gpu_memory_gib:.1f} GiB)"
        )
    elif required > budget:
        # The engine refuses a cache that cannot hold min_full_sequences of max_model_len (rules.kv_rule).
        reasons.append(
            f"KV cache for {seqs} sequence(s) of {max_len} tokens needs {kv_gib:.1f} GiB per GPU "
            f"but only {room:.1f} GiB is left after {weights_gib:.1f} GiB of weights and "
            f"{wl.overhead_gib:.1f} GiB overhead (budget {budget:.1f} GiB); lower max_model_len "
            "or use more GPUs"
        )
    elif budget - required < 0.05 * budget:
        warnings.append(
            f"only {budget - required:.1f} GiB of headroom per GPU: the estimate may be off by more than that"
        )
    return Memory(
        weights_gib=weights_gib,
        weights_source=source,
        kv_cache_gib=kv_gib,
        kv_bytes_per_token=full,
        overhead_gib=wl.overhead_gib,
        required_gib=required,
        budget_gib=budget,
        max_full_sequences=fits,
        max_model_len=max_len,
    )


def _verdict(
    m: ModelSpec,
    layout: Layout,
    hw: Hardware,
    wl: Workload,
    weight_bytes: int | None,
    devices: Sequence[int] | None = None,
    engine: Engine = ENGINE,
) -> Verdict:
    reasons: list[str] = []
    warnings: list[str] = []
    _hardware_reasons(layout, hw, wl, devices, reasons, engine.load_rules)
    if reasons and not all(isinstance(v, int) and v >= 1 for v in (layout.tp, layout.pp, layout.dp)):
        return Verdict(layout, False, tuple(reasons))
    missing = [
        k
        for k, v in (
            ("num_hidden_layers", m.num_layers),
            ("hidden_size", m.hidden_size),
            ("num_attention_heads", m.num_heads),
        )
        if v is None and not (k == "num_attention_heads" and m.attention_free)
    ]
    if missing:
        reasons.append(f"config.json has no usable {', '.join(missing)}: cannot decide whether {layout} can load")
    if not m.known:
        warnings.append(
            f"architecture {m.architecture or m.model_type or 'unknown'} is not one the planner "
            "knows: only generic checks ran"
        )
    warnings.extend(m.problems)
    found = engine.shape_rules(m, layout.tp, layout.pp, layout.dp, layout.ep)
    reasons.extend(found.reasons)
    warnings.extend(found.warnings)
    warnings.extend(_node_warnings(layout, hw))
    memory = _memory(m, layout, hw, wl, weight_bytes, reasons, warnings, engine)
    return Verdict(layout, not reasons, tuple(reasons), tuple(dict.fromkeys(warnings)), memory)


def shape_reasons(config: Mapping[str, Any], layout: Layout, *, engine: Engine = ENGINE) -> tuple[str, ...]:
    """Why the model's config.json alone refuses ``layout`` (the engine's shape rules: heads, blocks,
    experts, layers): what is known before any host is read. Empty when the shapes allow it."""
    m = parse_model(_as_mapping(config))
    return tuple(engine.shape_rules(m, layout.tp, layout.pp, layout.dp, layout.ep).reasons)


def check(
    config: Mapping[str, Any],
    layout: Layout,
    hw: Hardware,
    workload: Workload | None = None,
    weight_bytes: int | None = None,
    devices: Sequence[int] | None = None,
    *,
    engine: Engine = ENGINE,
) -> Verdict:
    """Verdict for one layout on ``engine``; devices are the GPU indices to use (default the first N)."""
    m = parse_model(_as_mapping(config))
    return _verdict(m, layout, hw, workload or Workload(), weight_bytes, devices, engine)


def _candidates(m: ModelSpec, gpu_count: int, rules: LoadRules) -> list[Layout]:
    if gpu_count <= _MAX_ENUMERATED_GPUS:
        sizes = list(range(1, gpu_count + 1))
    else:
        sizes = [2**i for i in range(int(math.log2(gpu_count)) + 1)]
    out = []
    for tp in sizes:
        for pp in sizes:
            for dp in sizes:
                if tp * pp * dp > gpu_count:
                    break
                out.append(Layout(tp, pp, dp, False))
                if m.is_moe and rules.expert_parallel is not None and rules.ep_size(tp, dp) > 1:
                    out.append(Layout(tp, pp, dp, True))
    return out


def _rank(m: ModelSpec, v: Verdict, hw: Hardware) -> tuple[float, ...]:
    lay = v.layout
    kv = m.num_kv_heads or 0
    replicated = 1 if (not m.is_mla and kv and lay.tp > kv) else 0
    ep_first = 0 if (lay.ep or not m.is_moe or lay.tp * lay.dp == 1) else 1
    seqs = (v.memory.max_full_sequences if v.memory else 0) * lay.dp
    crosses = 1 if lay.tp > hw.gpu_count else 0  # across nodes, PP over the network beats TP over it
    return (crosses, lay.pp, -lay.gpus, replicated, ep_first, -seqs, lay.dp, lay.tp)


def _why(m: ModelSpec, v: Verdict, hw: Hardware, rules: LoadRules) -> str:
    lay = v.layout
    parts = [
        f"uses all {hw.total_gpus} GPUs"
        if lay.gpus == hw.total_gpus
        else f"uses {lay.gpus} of {hw.total_gpus} GPUs, leaves {hw.total_gpus - lay.gpus} free"
    ]
    if hw.nodes > 1:
        parts.append(
            f"{lay.gpus // hw.nodes} GPUs on each of {hw.nodes} nodes"
            + (", TP inside a box" if lay.tp <= hw.gpu_count else ", TP across boxes")
        )
    if m.is_mla:
        parts.append("MLA latent KV cache (not split by TP)")
    elif m.num_kv_heads:
        kv = m.num_kv_heads
        per = kv // lay.tp
        parts.append(
            f"{per} KV head{'s' if per > 1 else ''} per GPU"
            if lay.tp <= kv
            else f"KV heads replicated {lay.tp // kv}x (TP {lay.tp} > {kv} KV heads)"
        )
    if lay.ep and m.is_moe:
        per = math.ceil(m.num_experts / rules.ep_size(lay.tp, lay.dp))
        link = " (helps most on PCIe)" if hw.interconnect != "nvlink" else ""
        parts.append(f"expert parallel: {per} whole experts per GPU, no TP split of experts{link}")
    if lay.pp > 1:
        parts.append(f"{lay.pp} pipeline stages (bubbles; chosen only to fit)")
    if v.memory and v.memory.max_model_len:
        total = v.memory.max_full_sequences * lay.dp
        parts.append(f"KV room for {total} full {v.memory.max_model_len}-token sequence" + ("" if total == 1 else "s"))
    return "; ".join(parts)


def _valid_layouts(m: ModelSpec, hw: Hardware, wl: Workload, weight_bytes: int | None, engine: Engine) -> list[Verdict]:
    if not isinstance(hw.gpu_count, int) or hw.gpu_count < 1:
        return []
    rules = engine.load_rules
    candidates = _candidates(m, hw.total_gpus, rules)
    if hw.nodes > 1:  # a multi-node model uses every node
        candidates = [lay for lay in candidates if lay.gpus > hw.gpu_count * (hw.nodes - 1)]
    valid = [v for v in (_verdict(m, lay, hw, wl, weight_bytes, engine=engine) for lay in candidates) if v.valid]
    valid.sort(key=lambda v: _rank(m, v, hw))
    return [replace(v, why=_why(m, v, hw, rules)) for v in valid]


def layouts(
    config: Mapping[str, Any],
    hw: Hardware,
    workload: Workload | None = None,
    weight_bytes: int | None = None,
    *,
    engine: Engine = ENGINE,
) -> tuple[Verdict, ...]:
    """Every valid layout of ``engine`` on this host, best first, each with its why."""
    m = parse_model(_as_mapping(config))
    return tuple(_valid_layouts(m, hw, workload or Workload(), weight_bytes, engine))


def _fix(requested: Layout, valid: list[Verdict], hw: Hardware) -> str:
    if not valid:
        more = "more nodes, " if hw.nodes > 1 else "more nodes (nodes = [...]), "
        return (
            f"no layout fits on {hw} GPUs: use {more}more or larger GPUs, "
            "a smaller max_model_len, or a smaller quantization"
        )
    by_layout = {v.layout: v for v in valid}
    picks: list[Layout] = []
    smaller = [
        v.layout
        for v in valid
        if v.layout.pp == requested.pp
        and v.layout.dp == requested.dp
        and v.layout.ep == requested.ep
        and v.layout.tp < requested.tp
    ]
    if smaller:
        picks.append(max(smaller, key=lambda lay: lay.tp))
    toggled = Layout(requested.tp, requested.pp, requested.dp, not requested.ep)
    if toggled in by_layout:
        picks.append(toggled)
    if not picks:
        picks.append(valid[0].layout)
    return "use " + ", or ".join(p.phrase() for p in picks)


def plan(
    config: Mapping[str, Any],
    requested: Layout | None,
    hw: Hardware,
    workload: Workload | None = None,
    weight_bytes: int | None = None,
    devices: Sequence[int] | None = None,
    *,
    engine: Engine = ENGINE,
) -> Plan:
    """The requested layout's verdict (with a fix when invalid) and the valid layouts best first.

    With requested None the best valid layout is checked, so ``valid`` answers "does any layout
    fit this host"; when none does, TP over every GPU is reported with its reasons.
    """
    m = parse_model(_as_mapping(config))
    wl = workload or Workload()
    rules = engine.load_rules
    valid = _valid_layouts(m, hw, wl, weight_bytes, engine)
    if requested is None:
        gpus = hw.gpu_count if isinstance(hw.gpu_count, int) and hw.gpu_count >= 1 else 1
        requested = valid[0].layout if valid else Layout(tp=gpus, pp=max(hw.nodes, 1))
    verdict = _verdict(m, requested, hw, wl, weight_bytes, devices, engine)
    if verdict.valid:
        verdict = replace(verdict, why=_why(m, verdict, hw, rules))
    else:
        verdict = replace(verdict, fix=_fix(requested, valid, hw))
    return Plan(verdict, tuple(valid), _describe(m))
