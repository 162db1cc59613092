"""Normalise a Hugging Face ``config.json`` into the numbers the planner checks.

Configs disagree on names (``n_routed_experts`` vs ``num_local_experts`` vs ``num_experts``), nest
the language model (Kimi-K2.5 under ``text_config``), and in the wild carry wrong types. Everything
here is tolerant: a value that is missing or malformed becomes ``None`` plus a note in ``problems``,
never an exception, so the planner can always answer with a verdict. The fields an engine cannot build a
model without (layers, hidden size, heads) are the exception: ``check_model_config`` makes one that is
missing or impossible bad input where a file is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.engines.shapes import ATTENTION_FREE_ARCHS, ATTENTION_FREE_TYPES, ModelSpec, QuantSpec
from orchestrator.errors import ConfigError

# Keys under which multimodal wrappers nest the language model's config.
_NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config", "thinker_config")

# Families whose model code the shape rules were read against; anything else gets generic checks and a warning.
_FAMILIES: dict[str, str] = {
    "deepseek_v3": "deepseek_v3",
    "deepseek_v2": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "kimi_k25": "deepseek_v3",
    "minimax_m2": "minimax_m2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen2": "qwen3",
    "qwen2_moe": "qwen3_moe",
    "llama": "llama",
    "mistral": "llama",
    "glm4_moe": "glm4_moe",
    "gpt_oss": "gpt_oss",
    "mixtral": "qwen3_moe",
}
_ARCH_FAMILIES: dict[str, str] = {
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV2ForCausalLM": "deepseek_v3",
    "KimiK25ForConditionalGeneration": "deepseek_v3",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss",
    "Qwen2ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "qwen3_moe",
}


class _Reader:
    """Typed, tolerant access to a merged config view; records what was malformed."""

    def __init__(self, view: Mapping[str, Any]) -> None:
        self.view = view
        self.problems: list[str] = []

    def pos_int(self, *keys: str, allow_zero: bool = False) -> int | None:
        for key in keys:
            if key not in self.view or self.view[key] is None:
                continue
            value = self.view[key]
            number = _as_int(value)
            if number is None or number < 0 or (number == 0 and not allow_zero):
                self.problems.append(f"config key {key} has unusable value {_short(value)}")
                continue
            return number
        return None

    def text(self, key: str) -> str | None:
        value = self.view.get(key)
        return value if isinstance(value, str) else None


# No real model dimension comes near this; larger values are junk and would overflow float math.
_MAX_DIM = 2**40


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and abs(value) <= _MAX_DIM:
        return value
    return None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def merged_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level config overlaid with any nested language-model config (deepest wins)."""
    view: dict[str, Any] = {}
    current: Mapping[str, Any] | None = config
    for _ in range(4):  # nesting deeper than this is not a real config
        if current is None:
            break
        view.update({k: v for k, v in current.items() if isinstance(k, str)})
        nested = next((current[k] for k in _NESTED_TEXT_KEYS if isinstance(current.get(k), Mapping)), None)
        current = nested
    # A wrapper's quantization_config sits at the top in some repos, inside text_config in others.
    if not isinstance(view.get("quantization_config"), Mapping) and isinstance(
        config.get("quantization_config"), Mapping
    ):
        view["quantization_config"] = config["quantization_config"]
    return view


_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")


def _key_path(config: Mapping[str, Any], key: str) -> str:
    """Where merged_view took ``key`` from: the deepest nested config that has it (text_config.KEY)."""
    path: list[str] = []
    where, current = key, config
    for _ in range(4):
        if key in current:
            where = ".".join([*path, key])
        name = next((k for k in _NESTED_TEXT_KEYS if isinstance(current.get(k), Mapping)), None)
        if name is None:
            break
        path.append(name)
        current = current[name]
    return where


# Non-language models among them (a vision backbone, a geospatial model): no layer count or
# hidden size of a transformer to ask of them either.
NO_TRANSFORMER_ARCHS = frozenset({"Terratorch"})
NO_TRANSFORMER_TYPES = frozenset({"timm_wrapper"})
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
_HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
# (what the field counts, its names by precedence, why a model needs it)
_REQUIRED = (
    ("a layer count", _LAYER_KEYS, "the engine builds the model's layers from it"),
    ("a hidden size", _HIDDEN_KEYS, "every weight and the KV cache are sized from it"),
    ("a head count", _HEAD_KEYS, "every model with attention has one"),
)
# Fields a config may leave out, but when present must be usable: the engine sizes the KV cache by head_dim
# and the embedding and LM head by the vocabulary (0 planned a 0.0 GiB KV cache as "valid").
_OPTIONAL = (
    ("a head count", _KV_HEAD_KEYS, ""),
    ("a head size", ("head_dim",), ""),
    ("a vocabulary size", ("vocab_size", "padded_vocab_size"), ""),
)


def config_field_error(config: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first required field of a config.json that is missing or impossible, as (field path, value
    or "missing", why), or None. The layer count, the hidden size and the head counts present must be
    positive integers, and each of the first three must be there (under one of its names); a head_dim or
    vocabulary size, when given, is a positive integer too; the
    attention-free architectures may give 0 heads or none (never a negative or a non-number), and its
    non-transformer ones (Terratorch) need no layer count or hidden size."""
    view = merged_view(config)
    names = {a for a in (_architecture(view), _architecture(config)) if a} | {
        t for t in (view.get("model_type"), config.get("model_type")) if isinstance(t, str)
    }
    free = bool(names & (ATTENTION_FREE_ARCHS | ATTENTION_FREE_TYPES))
    bare = bool(names & (NO_TRANSFORMER_ARCHS | NO_TRANSFORMER_TYPES))
    for what, keys, _ in (*_REQUIRED, *_OPTIONAL):
        heads = keys in (_HEAD_KEYS, _KV_HEAD_KEYS)
        for key in keys:
            if view.get(key) is None:  # null is JSON's unset, as transformers reads it (the next name counts)
                continue
            n = _as_int(view[key])
            if n is None or n < 0 or (n == 0 and not (heads and free)):
                why = (
                    f"not {what}: a model with attention has at least one head (0 is only for the "
                    f"attention-free architectures: {', '.join(sorted(ATTENTION_FREE_ARCHS))})"
                    if n == 0 and heads
                    else f"not {what} (a positive integer)"
                )
                return _key_path(config, key), _short(view[key]), why
    for what, keys, need in _REQUIRED:
        exempt = bare or (keys == _HEAD_KEYS and free)
        if not exempt and all(view.get(k) is None for k in keys):
            also = f" (or {', '.join(keys[1:])})"
            return (
                keys[0],
                "missing",
                (
                    f"{need}{also}; only the attention-free architectures go without heads"
                    if keys == _HEAD_KEYS
                    else f"{need}{also}"
                ),
            )
    return None


def check_model_config(config: Mapping[str, Any], where: str) -> None:
    """ConfigError (exit 2) naming ``where`` (the file, or HOST:PATH), the field and its value when a
    required field of the config is missing or impossible (``config_field_error``): the engine could
    not build the model from it."""
    found = config_field_error(config)
    if found is not None:
        error = ConfigError(field_message(found), file=where)
        error.key = found[0]
        raise error


def field_message(found: tuple[str, str, str]) -> str:
    field, value, why = found
    return f"{field} is {value}: {why}"


def _family(architecture: str | None, model_type: str | None) -> str:
    if architecture in _ARCH_FAMILIES:
        return _ARCH_FAMILIES[architecture]
    if model_type in _FAMILIES:
        return _FAMILIES[model_type]
    return "generic"


def _architecture(view: Mapping[str, Any]) -> str | None:
    archs = view.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return None


_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1}


def parse_model(config: Mapping[str, Any]) -> ModelSpec:
    """Read a config.json (any nesting, any junk) into a ModelSpec; never raises."""
    view = merged_view(config)
    r = _Reader(view)
    top_arch = _architecture(config)
    arch = _architecture(view)
    model_type = r.text("model_type")
    family = _family(arch, model_type)
    if family == "generic":
        family = _family(top_arch, config.get("model_type") if isinstance(config.get("model_type"), str) else None)
    hidden = r.pos_int("hidden_size", "d_model", "n_embd")
    free = bool({arch, top_arch, model_type} & (ATTENTION_FREE_ARCHS | ATTENTION_FREE_TYPES))
    heads = r.pos_int(*_HEAD_KEYS, allow_zero=free) or None  # attention-free: 0 is no heads, not junk
    kv_heads = r.pos_int(*_KV_HEAD_KEYS, allow_zero=free) or None
    if kv_heads is None and heads is not None and view.get("num_key_value_heads") is None:
        kv_heads = heads  # HF default: no GQA
    head_dim = r.pos_int("head_dim")
    if head_dim is None and hidden and heads:
        head_dim = hidden // heads or None
    experts = r.pos_int("n_routed_experts", "num_local_experts", "num_experts", allow_zero=True) or 0
    moe_inter = r.pos_int("moe_intermediate_size") if experts else None
    inter = r.pos_int("intermediate_size", "ffn_dim", "n_inner")
    if experts and moe_inter is None:
        moe_inter, inter = inter, None  # MiniMax-M2, Mixtral, gpt-oss: intermediate_size is per expert
    num_layers = r.pos_int("num_hidden_layers", "n_layer", "num_layers")
    dense_layers = 0
    if experts:
        dense_layers = r.pos_int("first_k_dense_replace", allow_zero=True) or 0
        mlp_only = view.get("mlp_only_layers")
        if isinstance(mlp_only, list):
            dense_layers += sum(1 for x in mlp_only if _as_int(x) is not None)
        if num_layers is not None:
            dense_layers = min(dense_layers, num_layers)
    shared = 0
    if experts:
        n_shared = r.pos_int("n_shared_experts", allow_zero=True) or 0
        shared = n_shared * (moe_inter or 0)
        shared += r.pos_int("shared_expert_intermediate_size", "shared_intermediate_size", allow_zero=True) or 0
    kv_lora = r.pos_int("kv_lora_rank")
    dtype_name = r.text("torch_dtype") or r.text("dtype") or "bfloat16"
    window = r.pos_int("sliding_window")
    layer_types = view.get("layer_types")
    sliding_layers = 0
    if window and isinstance(layer_types, list):
        sliding_layers = sum(1 for t in layer_types if t == "sliding_attention")
        if num_layers is not None:
            sliding_layers = min(sliding_layers, num_layers)
    tie = view.get("tie_word_embeddings")
    return ModelSpec(
        architecture=arch or top_arch,
        model_type=model_type,
        family=family,
        num_layers=num_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=r.pos_int("vocab_size", "padded_vocab_size"),
        intermediate_size=inter,
        moe_intermediate_size=moe_inter,
        num_experts=experts,
        shared_intermediate_size=shared,
        num_dense_layers=dense_layers,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=r.pos_int("qk_rope_head_dim") if kv_lora else None,
        qk_nope_head_dim=r.pos_int("qk_nope_head_dim") if kv_lora else None,
        v_head_dim=r.pos_int("v_head_dim") if kv_lora else None,
        q_lora_rank=r.pos_int("q_lora_rank") if kv_lora else None,
        max_position_embeddings=r.pos_int("max_position_embeddings", "n_positions", "seq_length"),
        tie_word_embeddings=tie is True,
        dtype_bytes=_DTYPE_BYTES.get(dtype_name, 2),
        sliding_window=window if sliding_layers else None,
        num_sliding_layers=sliding_layers,
        quant=parse_quant(view.get("quantization_config")),
        problems=tuple(r.problems),
    )


# Representative module names, DeepSeek-style, to test a checkpoint's "ignore" patterns against.
_PROBES = {
    "attn": "model.layers.1.self_attn.o_proj",
    "dense_mlp": "model.layers.0.mlp.down_proj",
    "shared_experts": "model.layers.1.mlp.shared_experts.down_proj",
    "experts": "model.layers.1.mlp.experts.0.down_proj",
}


def _ignored(name: str, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern.startswith("re:"):
            try:
                if re.match(pattern[3:], name):
                    return True
            except re.error:
                continue
        elif name == pattern or name.endswith("." + pattern) or f".{pattern}." in f".{name}.":
            return True
    return False


def _str_list(value: object) -> list[str]:
    return [x for x in value if isinstance(x, str)] if isinstance(value, list) else []


def _int_pair(value: object) -> tuple[int, int] | None:
    if isinstance(value, list | tuple) and len(value) == 2:
        n, k = _as_int(value[0]), _as_int(value[1])
        if n is not None and k is not None and n > 0 and k > 0:
            return (n, k)
    return None


def parse_quant(qc: object) -> QuantSpec:
    """Read ``quantization_config``: method, FP8 block, INT group, and what it covers."""
    if not isinstance(qc, Mapping):
        return QuantSpec()
    method = qc.get("quant_method")
    method = method.lower() if isinstance(method, str) else "unknown"
    ignore = (
        _str_list(qc.get("ignore")) + _str_list(qc.get("modules_to_not_convert")) + _str_list(qc.get("ignored_layers"))
    )
    block = _int_pair(qc.get("weight_block_size"))
    group = _as_int(qc.get("group_size"))
    bits = _as_int(qc.get("bits")) or _as_int(qc.get("w_bit"))
    groups = qc.get("config_groups")
    if isinstance(groups, Mapping):  # compressed-tensors: take the first group's weight scheme
        for g in groups.values():
            weights = g.get("weights") if isinstance(g, Mapping) else None
            if isinstance(weights, Mapping):
                bits = _as_int(weights.get("num_bits")) or bits
                if weights.get("strategy") == "block":
                    block = _int_pair(weights.get("block_structure")) or block
                elif weights.get("strategy") == "group":
                    group = _as_int(weights.get("group_size")) or group
                break
    if method == "mxfp4":
        # gpt-oss: only the experts are MXFP4 (block of 32 values); attention and router stay BF16.
        return QuantSpec(method=method, group_size=32, bits=4, experts=True)
    covered = {part: not _ignored(name, ignore) for part, name in _PROBES.items()}
    return QuantSpec(
        method=method,
        block=block,
        group_size=group if group is not None and group > 0 else None,
        bits=bits if bits is not None and 0 < bits <= 16 else None,
        **covered,
    )
