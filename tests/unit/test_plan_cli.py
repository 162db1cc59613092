"""`orchestrator plan` on the published MiniMax-M2.5 config, and the switch's preflight refusal."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.core.states import Phase

from .cli_runner import run
from .conftest import World, make_catalog

REPO = Path(__file__).resolve().parents[2]
MINIMAX = REPO / "tests/fixtures/configs/MiniMaxAI__MiniMax-M2.5.json"


def plan(*args: str) -> tuple[int, dict[str, object]]:
    r = run("plan", "--config", str(MINIMAX), "--gpus", "8", "--gpu-memory-gib", "96", "--json", *args, cwd=REPO)
    return r.returncode, json.loads(r.stdout)


def test_tp8_without_ep_is_refused_with_numbers_and_fix() -> None:
    """TP=8 fails on 1536/8 = 192 vs the FP8 block 128, and the fix names TP=4 and TP=8 + EP."""
    code, out = plan("--tp", "8")
    assert code == 3 and out["valid"] is False
    assert any("1536 / TP 8 = 192" in r and "128" in r for r in out["reasons"])  # type: ignore[union-attr]
    assert out["fix"] == "use TP=4, or TP=8 with expert parallel"


def test_tp8_with_ep_is_valid() -> None:
    """Expert parallel keeps experts whole: TP=8 + EP loads."""
    code, out = plan("--tp", "8", "--ep")
    assert code == 0 and out["valid"] is True and out["reasons"] == []


def test_tp6_is_refused_on_kv_heads() -> None:
    """8 KV heads do not split six ways."""
    code, out = plan("--tp", "6")
    assert code == 3
    assert any("num_key_value_heads 8 is not divisible by TP 6" in r for r in out["reasons"])  # type: ignore[union-attr]


def test_layouts_are_listed_best_first() -> None:
    """Without --tp the best layout is judged and every valid layout is listed."""
    code, out = plan()
    layouts = out["layouts"]
    assert code == 0 and isinstance(layouts, list) and layouts[0]["layout"]["name"] == "TP=8 + EP"
    assert {"TP=4", "TP=8 + EP"} <= {lay["layout"]["name"] for lay in layouts}


def test_switch_refuses_invalid_layout_before_stopping() -> None:
    """A switch to TP=8 without EP aborts in preflight; the serving model is never stopped."""
    catalog = make_catalog(
        models={
            "alpha": {"repo": "org/alpha", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8000},
            "mm-tp8": {"repo": "MiniMaxAI/MiniMax-M2.5", "gpus": list(range(8)), "tensor_parallel": 8, "port": 8001},
        }
    )
    world = World(catalog)
    world.switch("alpha")
    model_dir = world.engine.spec_for(catalog.models["mm-tp8"]).model_dir
    world.host.files[f"{model_dir}/config.json"] = MINIMAX.read_bytes()
    dep = world.switch("mm-tp8")
    assert dep.phase is Phase.ABORTED
    assert "cannot load as TP=8" in (dep.error or "") and "use TP=4, or TP=8 with expert parallel" in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]
    assert "stop vllm-alpha.service" not in world.host.calls


def test_unknown_host_is_named_without_traceback() -> None:
    """plan MODEL --on NOPE exits 2 naming the host and the known ones."""
    r = run(
        "plan",
        "minimax-m25",
        "--on",
        "nope",
        "--model-config",
        str(MINIMAX),
        "--config",
        str(REPO / "deploy.toml"),
        cwd=REPO,
    )
    assert r.returncode == 2 and "unknown host 'nope' (known: blackwell)" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_restore_under_any_trigger_skips_the_layout_check() -> None:
    """A rollback is known by its record, not its trigger's wording: tune's restore of a revision that
    loaded once is not refused by a layout check that the catalog's config.json would fail now."""
    catalog = make_catalog(
        models={
            "alpha": {"repo": "org/alpha", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8000},
            "mm-tp8": {"repo": "MiniMaxAI/MiniMax-M2.5", "gpus": list(range(8)), "tensor_parallel": 8, "port": 8001},
        }
    )
    world = World(catalog)
    assert world.switch("mm-tp8").phase is Phase.ACTIVE  # no config.json on the box yet: nothing to check
    world.switch("alpha")
    model_dir = world.engine.spec_for(catalog.models["mm-tp8"]).model_dir
    world.host.files[f"{model_dir}/config.json"] = MINIMAX.read_bytes()
    dep = world.engine.plan_rollback("box", 1, trigger="tune:7:restore")
    assert dep.restores == 1
    assert world.engine.run(dep.id).phase is Phase.ACTIVE


def test_a_bare_config_that_is_missing_or_not_json_is_named_not_asked_for(tmp_path: Path) -> None:
    """`plan --config PATH --gpus N` with no MODEL: a missing or non-JSON PATH is named (exit 2), not
    answered with 'plan a bare config.json with --config PATH' (which it was)."""
    toml = tmp_path / "my deploy"
    toml.write_text("[hosts.a]\ngpus = 8\n")
    for path, why in ((tmp_path / "gone", "file not found"), (toml, "not valid JSON")):
        r = run("plan", "--config", str(path), "--gpus", "8", "--gpu-memory-gib", "80", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"model config {path}: {why}" in r.stderr and "name a MODEL" not in r.stderr
    assert f"orchestrator plan MODEL --config '{toml}'" in r.stderr
