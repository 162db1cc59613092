"""A model config whose head counts cannot be (num_key_value_heads 0, a negative or missing
num_attention_heads) is bad input wherever it is read: exit 2 naming the file, the field and the value;
vLLM's attention-free architectures (Mamba, Mamba2, FalconMamba) have no heads and plan as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.planner_arch import config_field_error, parse_model
from tests.unit.cli_runner import invoke

LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 11008,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}
MAMBA: dict[str, Any] = {
    "architectures": ["MambaForCausalLM"],
    "model_type": "mamba",
    "hidden_size": 2560,
    "num_hidden_layers": 64,
    "vocab_size": 50280,
    "intermediate_size": 5120,
}
BAD = [
    ({"num_key_value_heads": 0}, "num_key_value_heads", "0"),
    ({"num_key_value_heads": -2}, "num_key_value_heads", "-2"),
    ({"num_attention_heads": 0}, "num_attention_heads", "0"),
    ({"num_attention_heads": -32}, "num_attention_heads", "-32"),
    ({"num_key_value_heads": "eight"}, "num_key_value_heads", "'eight'"),
    ({"num_attention_heads": None}, "num_attention_heads", "missing"),
]


def _with(change: dict[str, Any]) -> dict[str, Any]:
    cfg = {**LLAMA, **change}
    return {k: v for k, v in cfg.items() if v is not None}


@pytest.mark.parametrize("change,field,value", BAD, ids=[f"{f}={v}" for _, f, v in BAD])
def test_plan_refuses_a_config_with_an_impossible_head_count(
    tmp_path: Path, change: dict[str, Any], field: str, value: str
) -> None:
    """`plan --config FILE`: exit 2, the message names the file, the field and the value (it was a warning)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with(change)))
    result = invoke("plan", "--config", str(path), "--gpus", "8", "--gpu-memory-gib", "80", "--tp", "8")
    assert result.exit_code == 2, result.output
    assert f"{path}: {field} is {value}: " in result.output


def test_a_nested_language_config_is_named_by_its_path(tmp_path: Path) -> None:
    """A wrapper's text_config with num_key_value_heads 0 is named text_config.num_key_value_heads."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Wrapper"], "text_config": _with({"num_key_value_heads": 0})}))
    result = invoke("plan", "--config", str(path), "--gpus", "8", "--gpu-memory-gib", "80", "--tp", "8")
    assert result.exit_code == 2, result.output
    assert f"{path}: text_config.num_key_value_heads is 0: not a head count" in result.output


def test_a_catalog_model_config_with_zero_kv_heads_refuses_the_deploy_toml(tmp_path: Path) -> None:
    """models.a.config naming such a file: deploy.toml is refused at load (exit 2), naming both files and the field."""
    (tmp_path / "config.json").write_text(json.dumps(_with({"num_key_value_heads": 0})))
    cfg = tmp_path / "deploy.toml"
    cfg.write_text('[hosts.box]\ngpus = 8\n[models.a]\nrepo = "org/a"\nconfig = "config.json"\ngpus = [0]\n')
    result = invoke("models", "--config", str(cfg))
    assert result.exit_code == 2, result.output
    assert "models.a.config" in result.output and "num_key_value_heads is 0: not a head count" in result.output
    assert str(tmp_path / "config.json") in result.output


def test_an_attention_free_architecture_plans_without_heads(tmp_path: Path) -> None:
    """Mamba has no attention (vLLM: IsAttentionFree, 0 KV heads): no head count is asked of it."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**MAMBA, "num_key_value_heads": 0}))
    result = invoke("plan", "--config", str(path), "--gpus", "8", "--gpu-memory-gib", "80", "--tp", "1", "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 0 and out["valid"] is True, result.output
    assert [w for w in out["reasons"] + out["warnings"] if "head" in w] == []


@pytest.mark.parametrize(
    "cfg",
    [
        LLAMA,
        MAMBA,
        {**MAMBA, "model_type": "falcon_mamba", "architectures": ["FalconMambaForCausalLM"]},
        {"num_attention_heads": 8, "n_head": 8, "hidden_size": 64, "n_layer": 2},
    ],
)
def test_usable_head_counts_are_no_error(cfg: dict[str, Any]) -> None:
    """GQA, no GQA (kv heads absent: as many as heads), attention-free, an alias: nothing to refuse."""
    assert config_field_error({k: v for k, v in cfg.items() if k != "num_key_value_heads"}) is None
    assert config_field_error(cfg) is None


def test_a_negative_count_is_refused_even_for_an_attention_free_architecture() -> None:
    """Attention-free excuses a zero or a missing count, never a negative one."""
    assert config_field_error({**MAMBA, "num_key_value_heads": -1}) == (
        "num_key_value_heads",
        "-1",
        "not a head count (a positive integer)",
    )


def test_a_switch_to_weights_whose_config_has_zero_kv_heads_aborts_in_preflight() -> None:
    """The staged config.json on the host says num_key_value_heads 0: the switch aborts naming the host's
    file, the field and the value, and the serving model is never stopped."""
    from orchestrator.core.states import Phase

    from .conftest import World, make_catalog

    catalog = make_catalog(
        models={
            "alpha": {"repo": "org/alpha", "gpus": [0], "port": 8000},
            "beta": {"repo": "org/beta", "gpus": [0], "port": 8001},
        }
    )
    world = World(catalog)
    world.switch("alpha")
    model_dir = world.engine.spec_for(catalog.models["beta"]).model_dir
    world.host.files[f"{model_dir}/config.json"] = json.dumps(_with({"num_key_value_heads": 0})).encode()
    dep = world.switch("beta")
    assert dep.phase is Phase.ABORTED
    assert f"{model_dir}/config.json: num_key_value_heads is 0: not a head count" in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]


# Every field vLLM builds a model from, missing or impossible, the same way as a head count (it was a
# plan refusal, exit 3, "config.json has no usable num_hidden_layers").
REQUIRED = [
    ({"num_hidden_layers": None}, "num_hidden_layers", "missing"),
    ({"num_hidden_layers": 0}, "num_hidden_layers", "0"),
    ({"num_hidden_layers": -4}, "num_hidden_layers", "-4"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers", "'32'"),
    ({"num_hidden_layers": 2.5}, "num_hidden_layers", "2.5"),
    ({"hidden_size": None}, "hidden_size", "missing"),
    ({"hidden_size": 0}, "hidden_size", "0"),
    ({"hidden_size": True}, "hidden_size", "True"),
    ({"hidden_size": 2**60}, "hidden_size", str(2**60)),
    ({"hidden_size": None, "d_model": -1}, "d_model", "-1"),
    ({"head_dim": 0}, "head_dim", "0"),
    ({"head_dim": -128}, "head_dim", "-128"),
    ({"head_dim": "128"}, "head_dim", "'128'"),
    ({"vocab_size": 0}, "vocab_size", "0"),
    ({"vocab_size": -5}, "vocab_size", "-5"),
    ({"vocab_size": 3.5}, "vocab_size", "3.5"),
]


@pytest.mark.parametrize("change,field,value", REQUIRED, ids=[f"{f}={v}" for _, f, v in REQUIRED])
def test_plan_refuses_a_config_missing_or_with_an_impossible_required_field(
    tmp_path: Path, change: dict[str, Any], field: str, value: str
) -> None:
    """`plan --config FILE` without a usable layer count, hidden size, head size or vocabulary: exit 2 naming all."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with(change)))
    result = invoke("plan", "--config", str(path), "--gpus", "8", "--gpu-memory-gib", "80", "--tp", "8")
    assert result.exit_code == 2, result.output
    assert f"{path}: {field} is {value}: " in result.output


def test_a_nested_language_config_missing_its_layers_is_named_at_the_top() -> None:
    """A wrapper whose text_config has no layer count under any name: num_hidden_layers is missing."""
    nested = {"architectures": ["Wrapper"], "text_config": _with({"num_hidden_layers": None})}
    found = config_field_error(nested)
    assert found is not None and found[:2] == ("num_hidden_layers", "missing") and "n_layer" in found[2]


def test_a_catalog_model_config_without_hidden_size_refuses_the_deploy_toml(tmp_path: Path) -> None:
    """models.a.config naming a config with no hidden size: deploy.toml is refused at load (exit 2)."""
    (tmp_path / "config.json").write_text(json.dumps(_with({"hidden_size": None})))
    cfg = tmp_path / "deploy.toml"
    cfg.write_text('[hosts.box]\ngpus = 8\n[models.a]\nrepo = "org/a"\nconfig = "config.json"\ngpus = [0]\n')
    result = invoke("models", "--config", str(cfg))
    assert result.exit_code == 2, result.output
    assert "models.a.config" in result.output and "hidden_size is missing: " in result.output


@pytest.mark.parametrize(
    "cfg",
    [
        {"architectures": ["Terratorch"], "pretrained_cfg": {}},
        {"model_type": "timm_wrapper", "num_classes": 10},
        {**MAMBA, "num_hidden_layers": None, "n_layer": 64},
        {**LLAMA, "num_key_value_heads": None},
        {**LLAMA, "head_dim": None, "vocab_size": None},
    ],
)
def test_non_transformer_and_aliased_configs_need_no_more(cfg: dict[str, Any]) -> None:
    """Terratorch and timm need no layers or hidden size; an alias counts; a null is unset, as transformers reads it."""
    assert config_field_error(cfg) is None


def test_a_null_required_field_with_no_other_name_is_missing() -> None:
    """num_hidden_layers: null and no n_layer or num_layers: missing, as if absent."""
    found = config_field_error({**LLAMA, "num_hidden_layers": None})
    assert found is not None and found[:2] == ("num_hidden_layers", "missing")


def test_a_switch_to_weights_without_a_layer_count_aborts_in_preflight() -> None:
    """A staged config.json without num_hidden_layers aborts the switch naming the host's file; nothing stops."""
    from orchestrator.core.states import Phase

    from .conftest import World, make_catalog

    catalog = make_catalog(
        models={
            "alpha": {"repo": "org/alpha", "gpus": [0], "port": 8000},
            "beta": {"repo": "org/beta", "gpus": [0], "port": 8001},
        }
    )
    world = World(catalog)
    world.switch("alpha")
    model_dir = world.engine.spec_for(catalog.models["beta"]).model_dir
    world.host.files[f"{model_dir}/config.json"] = json.dumps(_with({"num_hidden_layers": None})).encode()
    dep = world.switch("beta")
    assert dep.phase is Phase.ABORTED
    assert f"{model_dir}/config.json: num_hidden_layers is missing: " in (dep.error or "")
    assert world.host.active_units() == ["vllm-alpha.service"]


def test_a_null_kv_head_count_plans_as_many_kv_heads_as_heads() -> None:
    """num_key_value_heads: null is transformers' default (no GQA): the planner counts 32 KV heads, not none."""
    assert parse_model({**LLAMA, "num_key_value_heads": None}).num_kv_heads == 32
