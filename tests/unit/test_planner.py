"""The planner's verdicts on the seeds' real configs, and the rules behind them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.planner import (
    Hardware,
    Layout,
    Workload,
    check,
    check_disk,
    estimate_weight_bytes_from_config,
    layouts,
    plan,
    weight_bytes_from_headers,
    weight_bytes_from_index,
)

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
SEED_HOST = Hardware(gpu_count=8, gpu_memory_gib=96.0, interconnect="pcie")
MINIMAX_BYTES = 230_000_000_000  # MiniMax-M2.5 FP8, as downloaded by the seeds
KIMI_BYTES = 547_000_000_000  # Kimi-K2.5 INT4, as downloaded by the seeds


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


@pytest.fixture(scope="module")
def minimax() -> dict[str, Any]:
    return load("MiniMaxAI__MiniMax-M2.5")


@pytest.fixture(scope="module")
def kimi() -> dict[str, Any]:
    return load("moonshotai__Kimi-K2.5")


def test_minimax_tp4_is_valid(minimax: dict[str, Any]) -> None:
    """MiniMax-M2.5 loads at TP=4 on the seeds' 8 x 96 GiB host, as the seeds observed."""
    v = check(minimax, Layout(tp=4), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert v.valid, v.reasons


def test_minimax_tp8_fails_on_the_fp8_block(minimax: dict[str, Any]) -> None:
    """TP=8 without EP is refused with vLLM's arithmetic: 1536 / 8 = 192 is not a multiple of 128."""
    v = check(minimax, Layout(tp=8), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert len(v.reasons) == 1
    reason = v.reasons[0]
    for needle in ("1536", "TP 8", "192", "128", "fp8.py"):
        assert needle in reason


def test_minimax_tp8_with_expert_parallel_is_valid(minimax: dict[str, Any]) -> None:
    """Expert parallel keeps experts whole, so TP=8 + EP loads (the seeds' 4,000 tok/s layout)."""
    v = check(minimax, Layout(tp=8, ep=True), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert v.valid, v.reasons


def test_minimax_tp6_fails_on_kv_heads(minimax: dict[str, Any]) -> None:
    """TP=6 passes the FP8 block (1536 / 6 = 256) but 8 KV heads do not split six ways."""
    v = check(minimax, Layout(tp=6), Hardware(6, 96.0), weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert len(v.reasons) == 1
    assert "num_key_value_heads 8" in v.reasons[0] and "TP 6" in v.reasons[0]


def test_minimax_tp8_plan_quotes_the_fix(minimax: dict[str, Any]) -> None:
    """The plan for the failed layout names both ways out, as the issue asks."""
    p = plan(minimax, Layout(tp=8), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert p.fix == "use TP=4, or TP=8 with expert parallel"


def test_minimax_tp6_plan_suggests_tp4(minimax: dict[str, Any]) -> None:
    """TP=6 has no EP way out (the KV heads still do not split), so the fix is TP=4 alone."""
    p = plan(minimax, Layout(tp=6), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert p.fix == "use TP=4"


def test_kimi_tp8_is_valid_with_honest_memory(kimi: dict[str, Any]) -> None:
    """Kimi-K2.5 (547 GB INT4, MLA) fits TP=8 on 8 x 96 GiB even at its full 262144-token context."""
    v = check(kimi, Layout(tp=8), SEED_HOST, weight_bytes=KIMI_BYTES)
    assert v.valid, v.reasons
    assert v.memory is not None
    # 547 GB / 8 = 63.7 GiB, plus MLA's replicated q_a/kv_a projections.
    assert 63.5 < v.memory.weights_gib < 67.0
    # MLA latent cache: 61 layers x (512 + 64) x 2 bytes, not divided by TP.
    assert v.memory.kv_bytes_per_token == 61 * 576 * 2
    assert v.memory.max_model_len == 262144
    assert v.memory.required_gib <= v.memory.budget_gib


def test_kimi_tp8_memory_is_tight_and_says_so(kimi: dict[str, Any]) -> None:
    """At the full context the margin is under 5% of the budget, and the verdict warns about it."""
    v = check(kimi, Layout(tp=8), SEED_HOST, weight_bytes=KIMI_BYTES)
    assert any("headroom" in w for w in v.warnings)


def test_kimi_nested_text_config_is_read(kimi: dict[str, Any]) -> None:
    """The config nested under text_config is read: TP=3 fails on its 64 heads and its vocabulary."""
    v = check(kimi, Layout(tp=3), Hardware(3, 400.0), weight_bytes=KIMI_BYTES)
    assert not v.valid
    assert any("vocab_size 163840" in r and "TP 3" in r for r in v.reasons)
    assert any("num_attention_heads 64" in r for r in v.reasons)


def test_kimi_refused_when_gpus_are_too_small(kimi: dict[str, Any]) -> None:
    """On 8 x 48 GiB the weights alone exceed the budget, and the reason names both numbers."""
    v = check(kimi, Layout(tp=8), Hardware(8, 48.0), weight_bytes=KIMI_BYTES)
    assert not v.valid
    assert any("weights need" in r and "43.2 GiB" in r for r in v.reasons)


def test_kv_cache_refusal_names_the_context(minimax: dict[str, Any]) -> None:
    """Weights that fit but leave too little KV cache for one full sequence are refused."""
    wl = Workload(max_model_len=196608, min_full_sequences=8)
    v = check(minimax, Layout(tp=4), SEED_HOST, wl, weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert any("KV cache for 8 sequence(s) of 196608 tokens" in r for r in v.reasons)


def test_too_many_gpus_requested(minimax: dict[str, Any]) -> None:
    """A layout needing more GPUs than the host has is refused with both counts."""
    v = check(minimax, Layout(tp=4, pp=2, dp=2), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert "needs 16 GPUs" in v.reasons[0] and "has 8" in v.reasons[0]


def test_busy_gpu_refused_by_index(minimax: dict[str, Any]) -> None:
    """A GPU whose free memory is below utilization x total is named by index."""
    hw = Hardware(8, 96.0, free_memory_gib=(95.0, 95.0, 20.0, 95.0, 95.0, 95.0, 95.0, 95.0))
    v = check(minimax, Layout(tp=4), hw, weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert any(r.startswith("GPU 2 has 20.0 GiB free") for r in v.reasons)


def test_chosen_gpu_indices_avoid_the_busy_one(minimax: dict[str, Any]) -> None:
    """Picking GPUs 4-7 sidesteps a busy GPU 2."""
    hw = Hardware(8, 96.0, free_memory_gib=(95.0, 95.0, 20.0, 95.0, 95.0, 95.0, 95.0, 95.0))
    v = check(minimax, Layout(tp=4), hw, weight_bytes=MINIMAX_BYTES, devices=[4, 5, 6, 7])
    assert v.valid, v.reasons


def test_unknown_gpu_index_refused(minimax: dict[str, Any]) -> None:
    """GPU indices beyond the host's count are refused."""
    v = check(minimax, Layout(tp=2), SEED_HOST, weight_bytes=MINIMAX_BYTES, devices=[7, 8])
    assert any("GPU indices [8] do not exist" in r for r in v.reasons)


def test_layouts_best_first_for_minimax(minimax: dict[str, Any]) -> None:
    """On the seeds' PCIe host the best layout is TP=8 + EP, and TP=4 is listed as valid."""
    found = layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert str(found[0].layout) == "TP=8 + EP"
    assert Layout(tp=4) in [v.layout for v in found]
    assert Layout(tp=8) not in [v.layout for v in found]


def test_layouts_prefer_no_pipeline_and_all_gpus(minimax: dict[str, Any]) -> None:
    """Ordering: no pipeline stages first, then more GPUs used."""
    found = layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES)
    keys = [(v.layout.pp, -v.layout.gpus) for v in found]
    assert keys == sorted(keys)


def test_layouts_each_say_why(minimax: dict[str, Any]) -> None:
    """Every listed layout carries a why naming GPUs and KV heads per GPU."""
    found = layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert found[0].why.startswith("uses all 8 GPUs; 1 KV head per GPU; expert parallel: 32 whole experts")
    assert all(v.why and v.valid for v in found)


def test_layouts_rank_fewer_gpus_after_all_gpus(minimax: dict[str, Any]) -> None:
    """TP=4 on 4 of 8 GPUs ranks below every layout using all 8, and says what it leaves free."""
    found = layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES)
    tp4 = next(i for i, v in enumerate(found) if v.layout == Layout(tp=4))
    all_eight = [i for i, v in enumerate(found) if v.layout.gpus == 8 and v.layout.pp == 1]
    assert all_eight and max(all_eight) < tp4
    assert "leaves 4 free" in found[tp4].why


def test_plan_to_dict_has_the_json_contract(minimax: dict[str, Any]) -> None:
    """--json carries valid, reasons and layouts (best first) and survives json.dumps."""
    d = plan(minimax, Layout(tp=8), SEED_HOST, weight_bytes=MINIMAX_BYTES).to_dict()
    assert d["valid"] is False
    assert d["reasons"] and isinstance(d["reasons"][0], str)
    assert d["layouts"][0]["layout"]["name"] == "TP=8 + EP"
    assert json.loads(json.dumps(d)) == d


def test_layout_str() -> None:
    """Layouts print the way operators write them."""
    assert str(Layout(8, ep=True)) == "TP=8 + EP"
    assert str(Layout(4, pp=2)) == "TP=4 + PP=2"
    assert Layout(2, pp=2, dp=2).gpus == 8


def test_weight_bytes_from_index() -> None:
    """metadata.total_size is the weight size; anything else is unknown."""
    assert weight_bytes_from_index({"metadata": {"total_size": 230_000_000_000}, "weight_map": {}}) == 230_000_000_000
    assert weight_bytes_from_index({"weight_map": {}}) is None
    assert weight_bytes_from_index({"metadata": {"total_size": "big"}}) is None
    assert weight_bytes_from_index({"metadata": {"total_size": -1}}) is None


def test_weight_estimate_close_to_the_real_download(minimax: dict[str, Any]) -> None:
    """Without an index the config estimate of MiniMax-M2.5 FP8 is within 5% of the 230 GB download."""
    estimate = estimate_weight_bytes_from_config(minimax)
    assert estimate is not None
    assert abs(estimate - MINIMAX_BYTES) / MINIMAX_BYTES < 0.05


def test_check_disk() -> None:
    """Disk check names the path and both sizes, and passes when it fits."""
    assert check_disk(100, 200, "/srv/models") is None
    reason = check_disk(547_000_000_000, 120_000_000_000, "/srv/models")
    assert reason == "/srv/models: the download needs 547.0 GB but only 120.0 GB is free (427.0 GB short)"


def test_data_parallel_without_ep_still_shards_experts(minimax: dict[str, Any]) -> None:
    """Without EP vLLM shards experts over TP x DP ranks, so TP=4 + DP=2 hits the 192 rule too."""
    v = check(minimax, Layout(tp=4, dp=2), SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert not v.valid
    assert any("moe_intermediate_size 1536 / TP 4 x DP 2 = 192" in r for r in v.reasons)


def test_plan_without_a_requested_layout_checks_the_best(minimax: dict[str, Any]) -> None:
    """plan(config, None, ...) answers whether anything fits, using the best layout."""
    p = plan(minimax, None, SEED_HOST, weight_bytes=MINIMAX_BYTES)
    assert p.valid
    assert p.requested.layout == p.layouts[0].layout
    assert p.requested.why == p.layouts[0].why


def test_plan_without_a_requested_layout_when_nothing_fits(kimi: dict[str, Any]) -> None:
    """When no layout fits, plan(None) reports TP over all GPUs with its reasons and says so in the fix."""
    p = plan(kimi, None, Hardware(2, 24.0), weight_bytes=KIMI_BYTES)
    assert not p.valid
    assert p.requested.layout == Layout(tp=2)
    assert p.fix is not None and p.fix.startswith("no layout fits on 2 x 24 GiB GPUs")


def test_weight_bytes_from_safetensors_headers() -> None:
    """Without an index, the headers' data_offsets give the exact size; junk entries are skipped."""
    headers = [
        {"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}},
        {"b": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}, "c": {"data_offsets": "x"}},
    ]
    assert weight_bytes_from_headers(headers) == 16
    assert weight_bytes_from_headers([{"junk": 1}]) is None
