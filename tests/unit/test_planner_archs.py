"""Verdicts for the other architectures the planner knows, and generic handling of unknown ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.core.planner import Hardware, Layout, Workload, check, describe_model, layouts

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
H100 = Hardware(gpu_count=8, gpu_memory_gib=80.0, interconnect="nvlink")
H200 = Hardware(gpu_count=8, gpu_memory_gib=141.0, interconnect="nvlink")
SHORT = Workload(max_model_len=32768)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def test_qwen3_235b_fp8_tp8_needs_expert_parallel() -> None:
    """Qwen3-235B-A22B-FP8 hits the same 1536 / 8 = 192 block rule as MiniMax; EP lifts it."""
    cfg = load("Qwen__Qwen3-235B-A22B-FP8")
    assert not check(cfg, Layout(8), H100, SHORT).valid
    assert check(cfg, Layout(8, ep=True), H100, SHORT).valid


def test_qwen3_dense_tp8_replicates_nothing() -> None:
    """Qwen3-8B (8 KV heads) is valid at TP=8 with one KV head per GPU."""
    found = layouts(load("Qwen__Qwen3-8B"), H100, SHORT)
    tp8 = next(v for v in found if v.layout == Layout(8))
    assert "1 KV head per GPU" in tp8.why


def test_qwen3_dense_tp16_replicates_kv_heads() -> None:
    """TP=16 over 8 KV heads is allowed (replication) and warned about."""
    v = check(load("Qwen__Qwen3-8B"), Layout(16), Hardware(16, 80.0), SHORT)
    assert v.valid, v.reasons
    assert any("replicated 2x" in w for w in v.warnings)


def test_llama_70b_does_not_fit_one_gpu() -> None:
    """Llama-3.1-70B in BF16 (~141 GB) is refused on one 80 GiB GPU, accepted at TP=4."""
    cfg = load("meta-llama__Llama-3.1-70B-Instruct")
    assert not check(cfg, Layout(1), H100, SHORT).valid
    assert check(cfg, Layout(4), H100, SHORT).valid


def test_llama_pp_uneven_split_warns() -> None:
    """80 layers over PP=3 is allowed by get_pp_indices but warned about."""
    v = check(load("meta-llama__Llama-3.1-70B-Instruct"), Layout(2, pp=3), H100, SHORT)
    assert any("does not split evenly over PP 3" in w for w in v.warnings)


def test_deepseek_v3_fits_h200_not_h100() -> None:
    """DeepSeek-V3 FP8 (~690 GB) loads at TP=8 on H200s but not on 80 GiB H100s."""
    cfg = load("deepseek-ai__DeepSeek-V3")
    assert check(cfg, Layout(8), H200, SHORT).valid
    assert not check(cfg, Layout(8), H100, SHORT).valid


def test_deepseek_v3_is_mla() -> None:
    """MLA models report a latent cache of kv_lora_rank + qk_rope_head_dim per token and layer."""
    v = check(load("deepseek-ai__DeepSeek-V3"), Layout(8), H200, SHORT)
    assert v.memory is not None and v.memory.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert describe_model(load("deepseek-ai__DeepSeek-V3"))["attention"] == "MLA"


def test_glm45_air_fp8_tp8_block_rule() -> None:
    """GLM-4.5-Air-FP8: moe_intermediate_size 1408 / TP 8 = 176 is not a multiple of 128."""
    v = check(load("zai-org__GLM-4.5-Air-FP8"), Layout(8), H100, SHORT)
    assert any("moe_intermediate_size 1408 / TP 8 = 176" in r for r in v.reasons)


def test_gpt_oss_mxfp4_has_no_block_rule() -> None:
    """gpt-oss-120b's MXFP4 experts are padded by vLLM, so TP=8 is valid."""
    v = check(load("openai__gpt-oss-120b"), Layout(8), H100, SHORT)
    assert v.valid, v.reasons


def test_gpt_oss_sliding_layers_cache_only_the_window() -> None:
    """Half of gpt-oss's layers are sliding-window: per-token KV counts only the 18 full ones."""
    v = check(load("openai__gpt-oss-120b"), Layout(8), H100, SHORT)
    assert v.memory is not None and v.memory.kv_bytes_per_token == 18 * 2 * 1 * 64 * 2


def test_uneven_experts_under_ep_warn() -> None:
    """256 experts over EP size 6 is allowed (remainder on the first ranks) but warned about."""
    cfg = load("MiniMaxAI__MiniMax-M2.5")
    v = check(cfg, Layout(2, dp=3, ep=True), Hardware(6, 96.0), weight_bytes=230_000_000_000)
    assert any("do not split evenly over EP size 6" in w for w in v.warnings)


def test_unknown_architecture_gets_generic_checks_and_a_warning() -> None:
    """An unknown model still has its heads checked, and the verdict says only generic checks ran."""
    cfg = {
        "architectures": ["FancyNewForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 6,
        "vocab_size": 1000,
    }
    v = check(cfg, Layout(4), Hardware(4, 24.0))
    assert any("num_attention_heads 6 is not divisible by TP 4" in r for r in v.reasons)
    assert any("FancyNewForCausalLM is not one the planner knows" in w for w in v.warnings)


def test_config_without_shapes_is_invalid_not_an_exception() -> None:
    """A config with no layers, hidden size or heads is a clean invalid verdict."""
    v = check({"model_type": "mystery"}, Layout(1), Hardware(1, 24.0))
    assert not v.valid
    assert "num_hidden_layers, hidden_size, num_attention_heads" in v.reasons[0]


def test_glm45_air_fp8_down_projection_needs_block_k() -> None:
    """At TP=2 the dense down projection's input shard 10944 / 2 = 5472 misses block_k 128."""
    v = check(load("zai-org__GLM-4.5-Air-FP8"), Layout(2), H200, SHORT)
    assert any("intermediate_size 10944 / TP 2 = 5472" in r and "block_k" in r for r in v.reasons)


def test_merged_gate_up_misalignment_is_only_a_warning() -> None:
    """At TP=1 GLM-4.5-Air-FP8 loads on current vLLM; the misaligned merged gate_up is a warning."""
    v = check(load("zai-org__GLM-4.5-Air-FP8"), Layout(1), H200, SHORT)
    assert v.valid, v.reasons
    assert any("gate_up projection" in w and "PR #30836" in w for w in v.warnings)
