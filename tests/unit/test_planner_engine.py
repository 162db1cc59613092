"""The planner asks the engine for what its loader demands (Engine.load_rules), not vLLM by name."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.planner import Hardware, Layout, Workload, check, layouts, plan
from orchestrator.engines import VLLM, LoadRules

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
SEED_HOST = Hardware(gpu_count=8, gpu_memory_gib=96.0, interconnect="pcie")
MINIMAX_BYTES = 230_000_000_000
NO_EP = replace(VLLM, load_rules=replace(VLLM.load_rules, expert_parallel=None))


class HalfToStart(LoadRules):
    """An engine that starts with half of each GPU free, whatever its utilization."""

    def start_need_gib(self, gpu_memory_gib: float, utilization: float) -> float:
        return 0.5 * gpu_memory_gib


@pytest.fixture(scope="module")
def minimax() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text())
    return data


def test_an_engine_without_expert_parallel_gets_no_ep_layouts(minimax: dict[str, Any]) -> None:
    """An engine without expert parallel is offered no EP layout, where vLLM's best is TP=8 + EP."""
    assert any(v.layout.ep for v in layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES))
    assert not any(v.layout.ep for v in layouts(minimax, SEED_HOST, weight_bytes=MINIMAX_BYTES, engine=NO_EP))


def test_an_engine_without_expert_parallel_refuses_an_ep_layout(minimax: dict[str, Any]) -> None:
    """A requested EP layout on an engine without it is refused, and the fix does not offer EP."""
    p = plan(minimax, Layout(tp=8, ep=True), SEED_HOST, weight_bytes=MINIMAX_BYTES, engine=NO_EP)
    assert not p.valid
    assert "expert parallel: the engine has none" in p.requested.reasons
    assert p.fix is not None and "expert parallel" not in p.fix


def test_the_fp8_block_warning_names_the_engines_flag(minimax: dict[str, Any]) -> None:
    """The hint that EP lifts the MoE block rule names the engine's own flag."""
    v = check(
        minimax,
        Layout(tp=8),
        SEED_HOST,
        weight_bytes=MINIMAX_BYTES,
        engine=replace(VLLM, load_rules=replace(VLLM.load_rules, expert_parallel="--ep-on")),
    )
    assert any("expert parallel (--ep-on)" in w for w in v.warnings)


def test_the_free_memory_to_start_is_the_engines_rule(minimax: dict[str, Any]) -> None:
    """The free memory a GPU needs at start comes from the engine's start rule."""
    hw = replace(SEED_HOST, free_memory_gib=(80.0,) * 8)
    assert not check(minimax, Layout(tp=4), hw, weight_bytes=MINIMAX_BYTES).valid  # 0.9 x 96 = 86.4 > 80
    lenient = replace(
        VLLM, load_rules=HalfToStart(**{f.name: getattr(VLLM.load_rules, f.name) for f in fields(LoadRules)})
    )
    assert check(minimax, Layout(tp=4), hw, weight_bytes=MINIMAX_BYTES, engine=lenient).valid


def test_workload_defaults_are_the_engines() -> None:
    """A workload that says nothing takes the default engine's overhead, cap and utilization."""
    rules = VLLM.load_rules
    wl = Workload()
    assert (wl.overhead_gib, wl.max_num_seqs, wl.gpu_memory_utilization, wl.min_full_sequences) == (
        rules.overhead_gib,
        rules.max_num_seqs,
        rules.gpu_memory_utilization,
        rules.min_full_sequences,
    )
