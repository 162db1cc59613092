"""Memory and disk math: weight sizes (index, headers, config estimate), weights per GPU, KV per token.

Weights are estimated per component from the config (embedding, attention, dense MLP, shared and
routed experts), then scaled to the real byte count from ``model.safetensors.index.json`` when it
is known, so quantisation details we do not model (scales, MTP layers, a vision tower) are spread
over the components in proportion instead of being ignored.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.engines import ENGINE, LoadRules
from orchestrator.engines.shapes import ModelSpec, QuantSpec

GIB = 1024**3


@dataclass(frozen=True)
class Components:
    """Bytes of each weight group for the whole model."""

    embed: float = 0.0
    lm_head: float = 0.0
    attn: float = 0.0  # split over TP ranks
    attn_replicated: float = 0.0  # MLA's q_a/kv_a projections: ReplicatedLinear in deepseek_v2.py
    dense_mlp: float = 0.0
    shared_experts: float = 0.0
    experts: float = 0.0
    router: float = 0.0  # replicated

    @property
    def total(self) -> float:
        return (
            self.embed
            + self.lm_head
            + self.attn
            + self.attn_replicated
            + self.dense_mlp
            + self.shared_experts
            + self.experts
            + self.router
        )

    def scaled(self, factor: float) -> Components:
        return Components(
            *(
                getattr(self, f) * factor
                for f in (
                    "embed",
                    "lm_head",
                    "attn",
                    "attn_replicated",
                    "dense_mlp",
                    "shared_experts",
                    "experts",
                    "router",
                )
            )
        )


def _bytes_per_param(quant: QuantSpec, covered: bool, dtype_bytes: int) -> float:
    if not covered or quant.method is None:
        return float(dtype_bytes)
    if quant.block:  # FP8 block: 1 byte + one fp32 scale per block
        return 1.0 + 4.0 / (quant.block[0] * quant.block[1])
    bits = quant.bits or (8 if quant.method == "fp8" else None)
    if bits is None:
        return float(dtype_bytes)
    group = quant.group_size or 128
    scale_bytes = 1.0 if quant.method == "mxfp4" else 2.0  # mxfp4: e8m0 scale; int: bf16 scale
    return bits / 8 + scale_bytes / group


def components(m: ModelSpec) -> Components | None:
    """Estimated bytes per weight group; None when the config lacks the shapes to estimate."""
    if not (m.num_layers and m.hidden_size and m.num_heads):
        return None
    h, layers, q = m.hidden_size, m.num_layers, m.quant
    head_dim = m.head_dim or h // m.num_heads
    bpp = m.dtype_bytes
    vocab = m.vocab_size or 0
    embed = vocab * h * bpp
    lm_head = 0 if m.tie_word_embeddings else vocab * h * bpp
    replicated = 0.0
    if m.is_mla:
        nope, rope = m.qk_nope_head_dim or 0, m.qk_rope_head_dim or 0
        v_dim = m.v_head_dim or head_dim
        kv_lora = m.kv_lora_rank or 0
        q_b = (m.q_lora_rank or h) * m.num_heads * (nope + rope)
        attn = q_b + kv_lora * m.num_heads * (nope + v_dim) + m.num_heads * v_dim * h
        replicated = (h * m.q_lora_rank if m.q_lora_rank else 0) + h * (kv_lora + rope)
    else:
        kv = m.num_kv_heads or m.num_heads
        attn = h * head_dim * (2 * m.num_heads + 2 * kv)
    attn_b = attn * layers * _bytes_per_param(q, q.attn, bpp)
    replicated_b = replicated * layers * _bytes_per_param(q, q.attn, bpp)
    dense_layers = m.num_dense_layers if m.is_moe else layers
    dense = 3 * h * (m.intermediate_size or 0) * dense_layers * _bytes_per_param(q, q.dense_mlp, bpp)
    moe_layers = m.num_moe_layers
    experts = 3 * h * (m.moe_intermediate_size or 0) * m.num_experts * moe_layers
    shared = 3 * h * m.shared_intermediate_size * moe_layers
    return Components(
        embed=embed,
        lm_head=lm_head,
        attn=attn_b,
        attn_replicated=replicated_b,
        dense_mlp=dense,
        shared_experts=shared * _bytes_per_param(q, q.shared_experts, bpp),
        experts=experts * _bytes_per_param(q, q.experts, bpp),
        router=h * m.num_experts * moe_layers * bpp,
    )


def estimate_weight_bytes(m: ModelSpec) -> int | None:
    parts = components(m)
    return int(parts.total) if parts and parts.total > 0 else None


def weights_per_gpu(
    m: ModelSpec, tp: int, pp: int, dp: int, ep: bool, weight_bytes: int | None, rules: LoadRules = ENGINE.load_rules
) -> float | None:
    """Bytes of weights on the busiest GPU (the pipeline stage with the most layers); how experts
    spread over the ranks is the engine's (``rules``)."""
    parts = components(m)
    if parts is None or parts.total <= 0:
        if weight_bytes is None:
            return None
        return weight_bytes / (tp * pp)  # nothing known about the shapes: an even split
    if weight_bytes is not None:
        parts = parts.scaled(weight_bytes / parts.total)
    layers = m.num_layers or 1
    stage = math.ceil(layers / pp) / layers  # the busiest pipeline stage (the engine splits layers evenly)
    if m.is_moe and ep:
        # With EP the experts are whole and spread over the engine's EP size; the busiest rank holds
        # ceil(E / ep_size) of them (rules.ep_size).
        experts = parts.experts * math.ceil(m.num_experts / rules.ep_size(tp, dp)) / max(m.num_experts, 1)
    else:
        experts = parts.experts / rules.moe_split(tp, dp, ep)  # without EP, experts are sharded
    per_layer = (
        (parts.attn + parts.dense_mlp + parts.shared_experts) / tp + experts + parts.attn_replicated + parts.router
    )
    ends = parts.embed / tp + parts.lm_head / tp if pp == 1 else max(parts.embed, parts.lm_head) / tp
    return per_layer * stage + ends


def weight_bytes_from_index(index: Mapping[str, Any]) -> int | None:
    """metadata.total_size of a model.safetensors.index.json, or None when absent or not a size."""
    meta = index.get("metadata") if isinstance(index, Mapping) else None
    size = meta.get("total_size") if isinstance(meta, Mapping) else None
    if isinstance(size, bool) or not isinstance(size, int | float) or not math.isfinite(size) or size <= 0:
        return None
    return int(size)


def weight_bytes_from_headers(headers: Iterable[Mapping[str, Any]]) -> int | None:
    """Total tensor bytes from parsed safetensors headers (the JSON at the head of each file).

    Each tensor entry carries data_offsets [begin, end] into its file; the sum of (end - begin) is
    the exact weight size even without an index. None if no header has a usable entry.
    """
    total = 0
    for header in headers:
        if not isinstance(header, Mapping):
            continue
        for name, entry in header.items():
            offsets = entry.get("data_offsets") if isinstance(entry, Mapping) and name != "__metadata__" else None
            if (
                isinstance(offsets, list)
                and len(offsets) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
                and 0 <= offsets[0] <= offsets[1]
            ):
                total += offsets[1] - offsets[0]
    return total or None


def check_disk(needed_bytes: int, free_bytes: int, path: str) -> str | None:
    """A reason when the download does not fit on the filesystem holding path, else None."""
    if needed_bytes <= free_bytes:
        return None
    return (
        f"{path}: the download needs {needed_bytes / 1e9:.1f} GB but only {free_bytes / 1e9:.1f} GB "
        f"is free ({(needed_bytes - free_bytes) / 1e9:.1f} GB short)"
    )
