"""The pure decisions of `tune`: parsing, candidates, objectives, winner and margin, deploy.toml edit."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import planner
from orchestrator.core import tune as t
from orchestrator.core.catalog import Model
from orchestrator.core.tune_toml import edit_model, layout_changes, unified_diff
from orchestrator.errors import UsageError

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
SEED = planner.Hardware(8, 96.0, interconnect="pcie")
MINIMAX_BYTES = 230_000_000_000
BASE = Model(
    name="minimax-m25",
    repo="MiniMaxAI/MiniMax-M2.5",
    revision="a" * 40,
    port=8000,
    gpus=(0, 1, 2, 3),
    tensor_parallel=4,
)


def minimax() -> dict[str, Any]:
    return dict(json.loads((CONFIGS / "MiniMaxAI__MiniMax-M2.5.json").read_text()))


def rec(
    tok_s: dict[int, float], ttft_p90: float = 100.0, per_stream: float | None = None, ok: int = 10
) -> dict[str, Any]:
    return {
        "levels": [
            {
                "concurrency": c,
                "requests_ok": ok,
                "output_tok_s": v,
                "output_tok_s_per_stream": per_stream if per_stream is not None else v / c,
                "ttft_ms": {"p50": ttft_p90 / 2, "p90": ttft_p90, "p99": ttft_p90},
            }
            for c, v in tok_s.items()
        ]
    }


def cand(layout: str) -> t.Candidate:
    lay = t.parse_layout(layout)
    return t.Candidate(t.variant_name("m", lay), lay)


# -- parsing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,layout",
    [
        ("tp4", planner.Layout(4)),
        ("tp8+ep", planner.Layout(8, ep=True)),
        ("TP2+pp2", planner.Layout(2, pp=2)),
        ("tp4+dp2+ep", planner.Layout(4, dp=2, ep=True)),
    ],
)
def test_layout_parses(text: str, layout: planner.Layout) -> None:
    """tpN[+ppN][+dpN][+ep] parses to the planner's Layout and prints back in the short form."""
    assert t.parse_layout(text) == layout
    assert t.parse_layout(t.token(layout)) == layout


@pytest.mark.parametrize("text", ["", "ep", "tp", "tp0", "tp4+tp8", "tp4+ep+ep", "tp-2", "tp4,", "tp4 + pp2x", "8"])
def test_bad_layout_is_one_line_usage_error(text: str) -> None:
    """Anything but tpN[+ppN][+dpN][+ep] is refused naming the value."""
    with pytest.raises(UsageError, match="--layouts") as exc:
        t.parse_layouts(text)
    assert "\n" not in str(exc.value)


def test_duplicate_layout_refused() -> None:
    """The same layout twice would be measured twice: refused."""
    with pytest.raises(UsageError, match="tp4 given twice"):
        t.parse_layouts("tp4,tp8,TP4")


@pytest.mark.parametrize(
    "text,msg",
    [
        ("0,64", "'0' is less than 1"),
        ("1,-4", "'-4' is less than 1"),
        ("1,x", "'x' is not a whole number"),
        ("", "empty"),
        ("1,1", "twice"),
        ("1.5", "'1.5' is not a whole number"),
        ("1,65537", "'65537' is more than 65536"),
    ],
)
def test_bad_concurrency_refused(text: str, msg: str) -> None:
    """Zero, negative, non-integer or repeated levels are refused naming the value."""
    with pytest.raises(UsageError, match=msg):
        t.parse_concurrency(text)


def test_concurrency_parses() -> None:
    """1,64,256 gives the levels in order."""
    assert t.parse_concurrency(" 1, 64,256") == (1, 64, 256)


@pytest.mark.parametrize(
    "text,want",
    [
        ("throughput", t.Objective("throughput", 256)),
        ("throughput@64", t.Objective("throughput", 64)),
        ("single-stream", t.Objective("single-stream", 1)),
        ("tok-per-gpu@256", t.Objective("tok-per-gpu", 256)),
        ("ttft-p90@64:1500", t.Objective("ttft-p90", 64, 1500.0)),
    ],
)
def test_objective_parses(text: str, want: t.Objective) -> None:
    """Each documented objective parses; throughput defaults to the highest level."""
    assert t.parse_objective(text, (1, 64, 256)) == want


@pytest.mark.parametrize(
    "text,msg",
    [
        ("fastest", "unknown objective"),
        ("throughput@32", "not among"),
        ("ttft-p90@64", "needs a throughput floor"),
        ("throughput@64:5", "no :FLOOR"),
        ("single-stream@4", "takes no"),
    ],
)
def test_bad_objective_refused(text: str, msg: str) -> None:
    """An unknown objective, a level not measured, or a missing floor is a usage error."""
    with pytest.raises(UsageError, match=msg):
        t.parse_objective(text, (1, 64, 256))


# -- candidates -------------------------------------------------------------------------------------


def test_top_candidates_come_from_the_planner() -> None:
    """Without --layouts the planner's best valid layouts are the candidates, best first."""
    sel = t.select(BASE, minimax(), SEED, planner.Workload(), MINIMAX_BYTES, None, top=2)
    assert [c.name for c in sel.candidates] == ["minimax-m25.tp8-ep", "minimax-m25.tp4-dp2-ep"]
    assert sel.refused == ()


def test_refused_layout_is_set_apart_with_its_reason() -> None:
    """tp8 on MiniMax fails the FP8 block rule: it is refused with the reason, never a candidate."""
    sel = t.select(BASE, minimax(), SEED, planner.Workload(), MINIMAX_BYTES, t.parse_layouts("tp4,tp8,tp8+ep"), top=3)
    assert [c.name for c in sel.candidates] == ["minimax-m25.tp4", "minimax-m25.tp8-ep"]
    assert [t.token(r.layout) for r in sel.refused] == ["tp8"]
    assert "block" in sel.refused[0].reason


def test_variant_keeps_the_weights_and_takes_the_layout() -> None:
    """A variant has the model's repo, revision, port and served name; its own layout and GPUs."""
    c = t.Candidate("minimax-m25.tp8-ep", planner.Layout(8, ep=True))
    v = t.variant(BASE, c, host_gpus=8)
    assert (v.repo, v.revision, v.port, v.served) == (BASE.repo, BASE.revision, 8000, "minimax-m25")
    assert (v.name, v.tensor_parallel, v.expert_parallel, v.gpus) == (c.name, 8, True, tuple(range(8)))


def test_variant_with_seqs_sets_max_num_seqs() -> None:
    """--max-num-seqs makes one variant per cap, named by it."""
    lay = planner.Layout(4)
    c = t.Candidate(t.variant_name("tiny", lay, 16), lay, 16)
    assert c.name == "tiny.tp4-s16"
    assert t.variant(BASE, c, 8).max_num_seqs == 16


# -- scoring and the winner -------------------------------------------------------------------------


def test_throughput_winner_and_margin() -> None:
    """The highest tok/s at the chosen level wins; the margin is over the runner-up."""
    obj = t.parse_objective("throughput@256", (1, 256))
    d = t.decide(
        obj,
        [
            t.Measured(cand("tp4"), 4, (rec({1: 60, 256: 2586}),)),
            t.Measured(cand("tp8+ep"), 8, (rec({1: 55, 256: 3982}),)),
        ],
    )
    assert d.winner == cand("tp8+ep") and d.runner_up == cand("tp4")
    assert d.margin_pct == pytest.approx((3982 - 2586) / 2586 * 100)
    assert "repeat" in d.note


def test_tok_per_gpu_prefers_the_smaller_layout() -> None:
    """Per GPU, 2586 on 4 GPUs beats 3982 on 8."""
    obj = t.parse_objective("tok-per-gpu@256", (1, 256))
    d = t.decide(
        obj, [t.Measured(cand("tp4"), 4, (rec({256: 2586}),)), t.Measured(cand("tp8+ep"), 8, (rec({256: 3982}),))]
    )
    assert d.winner == cand("tp4")


def test_ttft_objective_respects_the_floor() -> None:
    """The lowest TTFT p90 wins only among candidates above the throughput floor."""
    obj = t.parse_objective("ttft-p90@64:1000", (64,))
    d = t.decide(
        obj,
        [
            t.Measured(cand("tp2"), 2, (rec({64: 500}, ttft_p90=50),)),
            t.Measured(cand("tp4"), 4, (rec({64: 1500}, ttft_p90=90),)),
            t.Measured(cand("tp8"), 8, (rec({64: 1800}, ttft_p90=120),)),
        ],
    )
    assert d.winner == cand("tp4") and d.runner_up == cand("tp8")
    assert d.margin_pct == pytest.approx(25.0)
    assert d.ranking[-1].candidate == cand("tp2") and d.ranking[-1].score is None


def test_failed_candidate_never_wins() -> None:
    """A candidate that failed to load ranks last with no score."""
    obj = t.parse_objective("single-stream", (1,))
    d = t.decide(
        obj, [t.Measured(cand("tp8"), 8, (), error="ValueError: boom"), t.Measured(cand("tp4"), 4, (rec({1: 80}),))]
    )
    assert d.winner == cand("tp4") and d.runner_up is None
    assert [r.candidate for r in d.ranking] == [cand("tp4"), cand("tp8")]


def test_margin_within_noise_is_called_a_tie() -> None:
    """With repeats, a margin smaller than the spread of the repeats is reported as a tie."""
    obj = t.parse_objective("throughput@1", (1,))
    d = t.decide(
        obj,
        [
            t.Measured(cand("tp4"), 4, (rec({1: 100}), rec({1: 110}))),
            t.Measured(cand("tp8"), 8, (rec({1: 102}), rec({1: 104}))),
        ],
    )
    assert d.winner == cand("tp4")
    assert d.noise_pct == pytest.approx(10 / 105 * 100)
    assert "tie" in d.note


def test_nothing_qualified() -> None:
    """When every candidate failed there is no winner, and the note says why."""
    d = t.decide(t.parse_objective("throughput@1", (1,)), [t.Measured(cand("tp4"), 4, (), error="x")])
    assert d.winner is None and "no candidate" in d.note


# -- the engine's error line ------------------------------------------------------------------------


def test_engine_error_line_is_taken_from_the_journal() -> None:
    """The engine's own last error line is picked, not systemd's lines about the unit."""
    error = (
        "checking: vllm-m.tp8.service failed (exit 1)\nlast lines of the journal of vllm-m.tp8.service:\n"
        "  INFO starting\n  Traceback (most recent call last):\n"
        "  ValueError: The output_size of gate's and up's weight = 192 is not divisible by block_n = 128.\n"
        "  vllm-m.tp8.service: Main process exited, code=exited, status=1/FAILURE\n"
        "  Failed to start vllm-m.tp8.service - vLLM m.tp8."
    )
    assert t.engine_error_line(error).startswith("ValueError: The output_size")


def test_engine_error_line_without_journal_is_the_first_line() -> None:
    """With no journal in the message, its first line stands for it."""
    assert t.engine_error_line("preflight: GPU 7 missing\nmore") == "preflight: GPU 7 missing"


# -- deploy.toml ------------------------------------------------------------------------------------

TOML = """# the seeds' box
[models.minimax-m25]
repo = "MiniMaxAI/MiniMax-M2.5"
gpus = [0, 1, 2, 3]   # four of eight
tensor_parallel = 4 # TP=4: 2,586 tok/s

[models.other]
repo = "x/y"
gpus = [4]
"""


def test_toml_edit_keeps_comments_and_adds_missing_keys() -> None:
    """Values change in place with their comments; a missing key is added inside the model's table."""
    new = edit_model(TOML, "minimax-m25", {"tensor_parallel": 8, "gpus": list(range(8)), "expert_parallel": True})
    assert "gpus = [0, 1, 2, 3, 4, 5, 6, 7]   # four of eight\n" in new
    assert "tensor_parallel = 8 # TP=4: 2,586 tok/s\nexpert_parallel = true\n\n[models.other]" in new
    assert tomllib.loads(new)["models"]["other"] == {"repo": "x/y", "gpus": [4]}
    diff = unified_diff(TOML, new, "deploy.toml")
    assert diff.startswith("--- a/deploy.toml\n+++ b/deploy.toml\n")
    assert "\n-tensor_parallel = 4 # TP=4: 2,586 tok/s\n" in diff and "\n+expert_parallel = true\n" in diff


def test_toml_edit_of_unknown_table_refused() -> None:
    """A model defined some other way (no [models.NAME] table) is refused, not guessed at."""
    with pytest.raises(UsageError, match=r"no \[models.gone\] table"):
        edit_model(TOML, "gone", {"tensor_parallel": 8})


def test_layout_changes_only_lists_what_differs() -> None:
    """Keys at their current (or default) value are left out of the edit."""
    cur = tomllib.loads(TOML)["models"]["minimax-m25"]
    want = {"tensor_parallel": 4, "pipeline_parallel": 1, "expert_parallel": True, "gpus": (0, 1, 2, 3)}
    assert layout_changes(cur, want, {"pipeline_parallel": 1, "expert_parallel": False}) == {"expert_parallel": True}


# -- feedback into plan -----------------------------------------------------------------------------


def test_measured_ranking_replaces_the_heuristic_and_failures_go_last() -> None:
    """Measured layouts lead in measured order; a layout that failed here is last, with error and date."""
    p = planner.plan(minimax(), planner.Layout(4), SEED, weight_bytes=MINIMAX_BYTES)
    assert [t.token(v.layout) for v in p.layouts[:2]] == ["tp8+ep", "tp4+dp2+ep"]
    fails = [t.Failure("tp8+ep", "ValueError: boom", 0.0, 7)]
    new, note = t.with_measurements(p, fails, [("tp4", 2586.0), ("tp2+dp2+ep", 2000.0)], "throughput@256 tok/s, run #7")
    toks = [t.token(v.layout) for v in new.layouts]
    assert toks[:2] == ["tp4", "tp2+dp2+ep"] and toks[-1] == "tp8+ep"
    assert new.layouts[-1].why == "FAILED to load on this host 1970-01-01 00:00 UTC (tune run #7): ValueError: boom"
    assert new.layouts[0].why.startswith("measured 2,586.0 (throughput@256 tok/s, run #7); ")
    assert "ranked by measurement" in note


def test_requested_layout_that_failed_here_gets_a_warning() -> None:
    """Planning a layout that failed on this host warns with the engine's error and the date."""
    p = planner.plan(minimax(), planner.Layout(8, ep=True), SEED, weight_bytes=MINIMAX_BYTES)
    new, _ = t.with_measurements(p, [t.Failure("tp8+ep", "ValueError: boom", 86400.0, 2)], [], "")
    assert new.requested.warnings[-1] == (
        "tp8+ep failed to load on this host 1970-01-02 00:00 UTC (tune run #2): ValueError: boom"
    )
