"""`orchestrator plan MODEL` on a host with sleep-enabled models: which can sleep together, and what a
switch to MODEL sleeps, stops and evicts (text and --json); a RAM budget that cannot hold the model
asleep exits 2 naming the key and the value."""

from __future__ import annotations

import json
from pathlib import Path

from .cli_runner import invoke

# A Llama-7B-shaped config: 6.7 B parameters in bf16, 12.6 GiB of weights by the planner's estimate.
LLAMA_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def deploy(tmp_path: Path, host: str = "memory_gib = 64", extra: str = "") -> Path:
    (tmp_path / "llama7b.json").write_text(json.dumps(LLAMA_7B))
    models = "".join(
        f'[models.{n}]\nrepo = "org/{n}"\ngpus = [0]\nport = {8001 + i}\nconfig = "llama7b.json"\n{sleep}\n'
        for i, (n, sleep) in enumerate(
            [
                ("a", 'sleep = "level1"'),
                ("b", 'sleep = "level1"'),
                ("c", 'sleep = "level1"'),
                ("d", 'sleep = "level2"'),
                ("e", ""),
            ]
        )
    )
    (tmp_path / "deploy.toml").write_text(
        f'state_dir = "{tmp_path}/state"\n[defaults]\nbind = "127.0.0.1"\ngpu_memory_utilization = 0.9\n'
        f'[hosts.box]\ntransport = "local"\ngpus = 8\ngpu_memory_gib = 141\n{host}\n{models}{extra}'
    )
    return tmp_path / "deploy.toml"


def plan_json(path: Path, *args: str) -> dict[str, object]:
    r = invoke("plan", "--config", str(path), "--json", *args)
    assert r.exit_code == 0, r.output
    residency = json.loads(r.output)["residency"]
    assert isinstance(residency, dict)
    return residency


def test_plan_says_which_models_can_sleep_together(tmp_path: Path) -> None:
    """48 GiB of RAM (64 less the 16 GiB reserve) holds three 12.6 GiB level1 sleepers; level2 needs none."""
    out = plan_json(deploy(tmp_path), "a")
    assert out["ram_budget_gib"] == 48.0 and out["can_sleep_together"] == ["a", "b", "c", "d"]
    assert out["left_out"] == []
    weights = {m["name"]: m["weights_gib"] for m in out["models"]}  # type: ignore[union-attr, index]
    assert 12 < weights["b"] < 13.5  # type: ignore[operator]


def test_plan_names_the_sleeper_beyond_the_budget(tmp_path: Path) -> None:
    """A 30 GiB budget holds two level1 sleepers: the third is listed beyond it, in text too."""
    path = deploy(tmp_path, host="sleep_ram_gib = 30")
    assert plan_json(path, "a")["left_out"] == ["c"]
    text = invoke("plan", "--config", str(path), "a").output
    assert "can sleep together: a, b, d" in text and "beyond the RAM budget: c" in text


def test_a_warm_switch_sleeps_the_displaced_model_and_wakes_the_target(tmp_path: Path) -> None:
    """b serving, a asleep: switching to a is warm, b sleeps."""
    switch = plan_json(deploy(tmp_path), "a", "--serving", "b", "--asleep", "a")["switch"]
    assert isinstance(switch, dict)
    assert (switch["wake"], switch["sleep"], switch["stop"], switch["evict"], switch["fits"]) == (
        True,
        ["b"],
        [],
        [],
        True,
    )


def test_a_full_budget_evicts_the_least_recently_served_sleeper(tmp_path: Path) -> None:
    """30 GiB, b and c asleep (c listed first: the least recently served), a serving, switch to e:
    c is evicted for a."""
    path = deploy(tmp_path, host="sleep_ram_gib = 30")
    r = invoke("plan", "--config", str(path), "e", "--serving", "a", "--asleep", "c,b")
    assert r.exit_code == 0, r.output
    assert "switch to e: cold start" in r.output and "  - a sleeps (level1, 12.6 GiB in host RAM)" in r.output
    assert (
        "c (asleep, the least recently served) is evicted: sleepers would hold 37.7 GiB of host RAM, over the 30.0 GiB"
    ) in r.output


def test_a_model_without_sleep_mode_is_stopped_by_the_switch(tmp_path: Path) -> None:
    """e has no sleep mode: switching from it to a stops it."""
    switch = plan_json(deploy(tmp_path), "a", "--serving", "e")["switch"]
    assert isinstance(switch, dict) and switch["stop"] == ["e"] and switch["wake"] is False


def test_a_budget_too_small_for_the_model_asleep_exits_2(tmp_path: Path) -> None:
    """sleep_ram_gib 10 for a 12.6 GiB level1 model: exit 2 naming the key, the value and the weights."""
    r = invoke("plan", "--config", str(deploy(tmp_path, host="sleep_ram_gib = 10")), "a")
    assert r.exit_code == 2
    assert "hosts.box.sleep_ram_gib = 10" in r.output and "models.a" in r.output and "12.6 GiB" in r.output


def test_an_unknown_model_in_asleep_exits_2(tmp_path: Path) -> None:
    """--asleep names a model not on the host: exit 2 naming the option and the value."""
    r = invoke("plan", "--config", str(deploy(tmp_path)), "a", "--asleep", "zz")
    assert r.exit_code == 2 and "--asleep 'zz'" in r.output and "not a model of host box" in r.output


def test_a_host_without_sleep_models_plans_as_before(tmp_path: Path) -> None:
    """No sleep mode on the host: no residency section in --json."""
    (tmp_path / "llama7b.json").write_text(json.dumps(LLAMA_7B))
    (tmp_path / "deploy.toml").write_text(
        f'state_dir = "{tmp_path}/state"\n[hosts.box]\ntransport = "local"\ngpus = 8\ngpu_memory_gib = 141\n'
        '[models.a]\nrepo = "org/a"\ngpus = [0]\nconfig = "llama7b.json"\n'
    )
    r = invoke("plan", "--config", str(tmp_path / "deploy.toml"), "a", "--json")
    assert r.exit_code == 0 and "residency" not in json.loads(r.output)


def test_weights_that_cannot_be_known_offline_are_said_so(tmp_path: Path) -> None:
    """A level1 model with no local config.json: its weights are listed as unknown, not as 0 GiB."""
    path = deploy(tmp_path)
    path.write_text(path.read_text().replace('port = 8002\nconfig = "llama7b.json"\n', "port = 8002\n"))
    r = invoke("plan", "--config", str(path), "a")
    assert r.exit_code == 0, r.output
    assert "b: level1, GPU 0 at 0.9, weights unknown here (not counted in RAM: set models.b.config)" in r.output
