"""The shape rules vLLM enforces when it builds a model for a parallel layout, and how its KV cache is
laid out per rank (pure: no I/O; the planner asks them as ``Engine.shape_rules`` and
``Engine.kv_bytes_per_token``).

Each rule mirrors a check in vLLM's source (file named in the comment) and, when broken, yields a
reason that names the numbers, so the operator sees the same arithmetic vLLM would fail on at load
time, minutes or hours later, after the old model was already stopped. How experts spread over the
ranks (expert parallel) and the flag that turns it on are the engine's ``LoadRules``.
"""

from __future__ import annotations

import math

from orchestrator.engines.base import LoadRules
from orchestrator.engines.shapes import Findings, ModelSpec

# vllm/model_executor/layers/vocab_parallel_embedding.py: DEFAULT_VOCAB_PADDING_SIZE
VOCAB_PADDING = 64

_FP8_LINEAR = "vllm/model_executor/layers/quantization/utils/fp8_utils.py validate_fp8_block_shape"
_FP8_MOE = "vllm/model_executor/layers/quantization/fp8.py Fp8MoEMethod.create_weights"
_MERGED_OK = (
    "vLLM since PR #30836 (Dec 2025) skips this check for merged gate_up/qkv layers "
    "(linear.py ColumnParallelLinear._maybe_allow_fp8_block_shape_mismatch); older vLLM refuses it"
)
_WNA16_MOE = (
    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe.py "
    "(scales are intermediate_size_per_partition // group_size)"
)


def _split(f: Findings, name: str, size: int, tp: int, cite: str) -> int | None:
    """size / tp when it divides (ColumnParallel/RowParallel use vllm.distributed.utils.divide)."""
    if size % tp:
        f.reasons.append(f"{name} {size} is not divisible by TP {tp} ({cite})")
        return None
    return size // tp


def _block(
    f: Findings, what: str, per_rank: int, block: tuple[int, int], row_split: bool, expr: str, cite: str
) -> bool:
    """Column-parallel rows must fill block_n; row-parallel inputs (TP > 1) must fill block_k."""
    dims = [("block_n", block[0])] + ([("block_k", block[1])] if row_split else [])
    bad = [(name, dim) for name, dim in dims if per_rank % dim]
    if not bad:
        return True
    sizes = sorted({dim for _, dim in bad})
    which = "/".join(name for name, _ in bad)
    f.reasons.append(
        f"{expr} = {per_rank} is not divisible by the FP8 weight block "
        f"{' or '.join(map(str, sizes))} ({which}) of {what} ({cite})"
    )
    return False


def _merged_rows(f: Findings, what: str, per_rank: int, block_n: int, expr: str) -> None:
    """Merged column-parallel layers (gate_up, qkv) may miss block_n on current vLLM: warn only."""
    if per_rank % block_n:
        f.warnings.append(
            f"{expr} = {per_rank} is not a multiple of the FP8 weight block {block_n} for {what}: {_MERGED_OK}"
        )


def attention_rules(m: ModelSpec, tp: int, f: Findings) -> None:
    if m.num_heads is None:
        return
    # vllm/config/model.py ModelConfig.verify_with_parallel_config
    if m.num_heads % tp:
        f.reasons.append(
            f"num_attention_heads {m.num_heads} is not divisible by TP {tp} "
            "(vllm/config/model.py verify_with_parallel_config)"
        )
    if m.is_mla or m.num_kv_heads is None:
        return  # MLA has one latent KV head, cached whole on every rank
    kv = m.num_kv_heads
    # vllm/model_executor/layers/linear.py QKVParallelLinear: divide(kv, tp) or divide(tp, kv)
    if tp > kv and tp % kv:
        f.reasons.append(
            f"num_key_value_heads {kv} cannot be replicated over TP {tp}: TP {tp} is not a "
            f"multiple of {kv} (vllm/model_executor/layers/linear.py QKVParallelLinear)"
        )
    elif tp <= kv and kv % tp:
        f.reasons.append(
            f"num_key_value_heads {kv} is not divisible by TP {tp} "
            f"({kv} / {tp} = {kv / tp:.2f}; vllm/model_executor/layers/linear.py "
            "QKVParallelLinear)"
        )
    elif tp > kv:
        f.warnings.append(
            f"TP {tp} > num_key_value_heads {kv}: each KV head is replicated {tp // kv}x, "
            "so the KV cache costs more memory per token"
        )


def vocab_rules(m: ModelSpec, tp: int, f: Findings) -> None:
    if m.vocab_size is None:
        return
    padded = -(-m.vocab_size // VOCAB_PADDING) * VOCAB_PADDING
    # vocab_parallel_embedding.py: pad_vocab_size(vocab, 64), then divide(padded, tp_size)
    if padded % tp:
        f.reasons.append(
            f"vocab_size {m.vocab_size} padded to a multiple of {VOCAB_PADDING} is {padded}, "
            f"not divisible by TP {tp} (vllm/model_executor/layers/vocab_parallel_embedding.py"
            " VocabParallelEmbedding)"
        )


def mlp_rules(m: ModelSpec, tp: int, dp: int, ep: bool, f: Findings, rules: LoadRules) -> None:
    q = m.quant
    cite = "vllm/model_executor/layers/linear.py MergedColumnParallelLinear"
    dense = [
        ("intermediate_size", m.intermediate_size, q.dense_mlp, "dense MLP's"),
        ("shared experts' intermediate size", m.shared_intermediate_size or None, q.shared_experts, "shared experts'"),
    ]
    for name, size, covered, what in dense:
        if not size:
            continue
        per = _split(f, name, size, tp, cite)
        if per is not None and covered and q.block:
            expr = f"{name} {size} / TP {tp}"
            _merged_rows(f, f"the {what} gate_up projection", per, q.block[0], expr)
            if tp > 1:  # down_proj is RowParallelLinear: its input shard must fill block_k
                _block(f, f"the {what} down projection", per, (1, q.block[1]), True, expr, _FP8_LINEAR)
    if not m.is_moe or not m.moe_intermediate_size:
        return
    size = m.moe_intermediate_size
    # The engine's split (vLLM: fused_moe/config.py FusedMoEParallelConfig.make): with EP each rank owns
    # whole experts (the MoE layer's tp_size becomes 1); without EP the experts are TP-sharded over all
    # tp*dp ranks (flatten_tp_across_dp), so DP does not spare the per-rank split.
    moe_tp = rules.moe_split(tp, dp, ep)
    if moe_tp == 1 and ep:
        per, expr = size, f"moe_intermediate_size {size} (whole experts under EP)"
    else:
        label = f"TP {tp}" if dp == 1 else f"TP {tp} x DP {dp}"
        if size % moe_tp:
            f.reasons.append(
                f"moe_intermediate_size {size} is not divisible by {label} = {moe_tp} "
                "(vllm/model_executor/layers/fused_moe/layer.py FusedMoE)"
            )
            return
        per, expr = size // moe_tp, f"moe_intermediate_size {size} / {label}"
    if not q.experts:
        return
    if q.block:
        if (
            not _block(f, "the MoE experts", per, q.block, moe_tp > 1, expr, _FP8_MOE)
            and not ep
            and rules.expert_parallel is not None
        ):
            f.warnings.append(
                f"expert parallel ({rules.expert_parallel}) keeps experts whole and lifts the MoE block constraint"
            )
    elif q.group_size and q.method != "mxfp4":
        # mxfp4 (gpt-oss) rounds the per-rank size up to its kernel's alignment: no hard rule.
        g = q.group_size
        if moe_tp > 1 and per % g:
            f.reasons.append(
                f"{expr} = {per} is not divisible by the quantization group size {g} for "
                f"the MoE experts' down projection ({_WNA16_MOE})"
            )
        elif per % max(64, g):
            f.warnings.append(
                f"{expr} = {per} is not a multiple of {max(64, g)}: the Marlin MoE kernel "
                "does not apply and vLLM falls back to a slower kernel "
                "(quantization/utils/marlin_utils.py check_moe_marlin_supports_layer)"
            )


def attention_block_rules(m: ModelSpec, tp: int, f: Findings) -> None:
    q = m.quant
    if not (q.block and q.attn and m.num_heads and m.num_heads % tp == 0 and m.head_dim):
        return
    heads = m.num_heads // tp
    if tp == 1:
        return  # nothing is split; a lone layer is never checked against its block
    if m.is_mla:
        # q_b_proj and kv_b_proj are single-output ColumnParallelLinear: block_n applies in full.
        for name, size in (
            ("q_b_proj", heads * ((m.qk_nope_head_dim or 0) + (m.qk_rope_head_dim or 0))),
            ("kv_b_proj", heads * ((m.qk_nope_head_dim or 0) + (m.v_head_dim or m.head_dim))),
        ):
            _block(f, f"attention {name}", size, (q.block[0], 1), False, f"{name} rows per rank", _FP8_LINEAR)
        o_in = heads * (m.v_head_dim or m.head_dim)
    else:
        kv_rank = max((m.num_kv_heads or m.num_heads) // tp, 1)
        _merged_rows(
            f, "the attention qkv projection", min(heads, kv_rank) * m.head_dim, q.block[0], "q/k/v rows per rank"
        )
        o_in = heads * m.head_dim
    _block(f, "attention o_proj", o_in, (1, q.block[1]), True, "o_proj input per rank", _FP8_LINEAR)


def expert_parallel_rules(m: ModelSpec, tp: int, dp: int, ep: bool, f: Findings, rules: LoadRules) -> None:
    if not ep:
        return
    if rules.expert_parallel is None:
        f.reasons.append("expert parallel: the engine has none")
        return
    if not m.is_moe:
        f.warnings.append("expert parallel has no effect: the model has no experts")
        return
    size = rules.ep_size(tp, dp)
    # fused_moe layer.py determine_expert_map: experts are spread with the remainder on the first
    # ranks, so uneven is allowed; only EPLB requires an even split.
    if m.num_experts < size:
        f.warnings.append(
            f"{m.num_experts} experts over EP size {size} (TP {tp} x DP {dp}): "
            f"{size - m.num_experts} ranks hold no expert"
        )
    elif m.num_experts % size:
        f.warnings.append(
            f"{m.num_experts} experts do not split evenly over EP size {size} (TP {tp} x DP "
            f"{dp}); vLLM gives the first {m.num_experts % size} ranks one more, and EPLB "
            "would refuse it"
        )


def pipeline_rules(m: ModelSpec, pp: int, f: Findings) -> None:
    if pp == 1 or m.num_layers is None:
        return
    # vllm/distributed/utils.py get_pp_indices: uneven splits are allowed, empty stages are not useful.
    if m.num_layers < pp:
        f.reasons.append(
            f"num_hidden_layers {m.num_layers} < PP {pp}: some pipeline stages would hold "
            "no layer (vllm/distributed/utils.py get_pp_indices)"
        )
    elif m.num_layers % pp:
        f.warnings.append(
            f"num_hidden_layers {m.num_layers} does not split evenly over PP {pp}: stages "
            f"hold {m.num_layers // pp} or {m.num_layers // pp + 1} layers "
            "(vllm/distributed/utils.py get_pp_indices; VLLM_PP_LAYER_PARTITION overrides)"
        )
    if not m.known:
        f.warnings.append(
            "pipeline parallel needs the model class to implement SupportsPP; unknown architecture, not verified"
        )


def shape_rules(m: ModelSpec, tp: int, pp: int, dp: int, ep: bool, rules: LoadRules) -> Findings:
    f = Findings()
    attention_rules(m, tp, f)
    vocab_rules(m, tp, f)
    mlp_rules(m, tp, dp, ep, f, rules)
    attention_block_rules(m, tp, f)
    expert_parallel_rules(m, tp, dp, ep, f, rules)
    pipeline_rules(m, pp, f)
    return f


def kv_bytes_per_token(m: ModelSpec, tp: int, pp: int, kv_cache_dtype: str) -> tuple[float, float]:
    """KV cache bytes per token on one GPU: (full-attention layers, sliding-window layers)."""
    if not m.num_layers:
        return (0.0, 0.0)
    elem = 1 if kv_cache_dtype.startswith("fp8") else m.dtype_bytes
    layers_per_stage = math.ceil(m.num_layers / pp)
    sliding = math.ceil(m.num_sliding_layers / pp) if m.sliding_window else 0
    full = max(layers_per_stage - sliding, 0)
    if m.is_mla:
        # MLA caches one compressed latent per token per layer, identical on every TP rank
        # (vllm/config/model.py get_num_kv_heads returns 1 for MLA; the MLA backends store
        # kv_lora_rank + qk_rope_head_dim per token).
        per_layer = ((m.kv_lora_rank or 0) + (m.qk_rope_head_dim or 0)) * elem
    else:
        kv = m.num_kv_heads or m.num_heads or 1
        # vllm/config/model.py get_num_kv_heads: max(1, kv_heads // tp); QKVParallelLinear
        # (linear.py) keeps one replicated head per rank when TP >= kv heads.
        heads_per_rank = max(kv // tp, 1) if kv % tp == 0 or tp % kv == 0 else math.ceil(kv / tp)
        per_layer = 2 * heads_per_rank * (m.head_dim or 0) * elem
    return (per_layer * full, per_layer * sliding)
