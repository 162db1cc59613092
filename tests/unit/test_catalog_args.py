"""deploy.toml ``args``: the flags the unit renders from keys (port, bind, served name, layout) are not
given a second time, and the errors of a model's config.json or a host's GPUs read plainly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.errors import ConfigError

BASE = """
[hosts.gpu1]
transport = "local"
gpus = 8
models_dir = "/models"

[models.a]
host = "gpu1"
repo = "org/a"
port = 8001
gpus = [0]
"""


def load(tmp_path: Path, extra: str, base: str = BASE) -> object:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(base + extra)
    return settings.load(cfg)


@pytest.mark.parametrize(
    ("args", "flag", "where"),
    [
        ('["--port", "9999"]', "--port", "the model's `port`"),
        ('["--host=1.2.3.4"]', "--host", "defaults.bind"),
        ('["--served-model-name", "other"]', "--served-model-name", "the model's `served_name`"),
        ('["--model", "/etc"]', "--model", "the model's source"),
        ('["--trust-remote-code", "-tp", "2"]', "-tp", "the model's `tensor_parallel`"),
        ('["--pipeline-parallel-size=2"]', "--pipeline-parallel-size", "the model's `pipeline_parallel`"),
        ('["--enable-expert-parallel"]', "--enable-expert-parallel", "the model's `expert_parallel`"),
        ('["--gpu-memory-utilization", "0.5"]', "--gpu-memory-utilization", "the model's `gpu_memory_utilization`"),
    ],
)
def test_args_repeating_a_rendered_flag_is_refused(tmp_path: Path, args: str, flag: str, where: str) -> None:
    """A flag the unit renders from a key, repeated in args (which the engine reads last), is refused naming it."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f"args = {args}\n")
    message = str(err.value)
    assert "models.a.args[" in message and f"the unit renders {flag} from {where}" in message
    assert str(tmp_path / "deploy.toml") in message


def test_args_may_carry_max_model_len_only_while_its_key_is_unset(tmp_path: Path) -> None:
    """``--max-model-len 32k`` (adopt's way for a value the key cannot hold) passes until max_model_len is set."""
    load(tmp_path, 'args = ["--max-model-len", "32k"]\n')
    with pytest.raises(ConfigError, match=r"models\.a\.args\[0\]: '--max-model-len': the unit renders"):
        load(tmp_path, 'max_model_len = 4096\nargs = ["--max-model-len", "32k"]\n')


def test_model_config_error_names_deploy_toml_once(tmp_path: Path) -> None:
    """A missing model config.json is one error naming deploy.toml once, then the key and the missing file."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, 'config = "nope.json"\n')
    cfg = tmp_path / "deploy.toml"
    assert str(err.value) == f"{cfg}: models.a.config: {tmp_path / 'nope.json'}: file not found"


def test_gpu_index_on_a_host_without_gpus_says_it_has_none(tmp_path: Path) -> None:
    """A model's GPU on a host of ``gpus = 0`` names the host as having no GPUs, not a range '0--1'."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, "", BASE.replace("gpus = 8", "gpus = 0"))
    assert "GPU index 0 is out of range: host gpu1 has no GPUs (hosts.gpu1.gpus = 0)" in str(err.value)


RAY = """
[hosts.g1]
address = "10.0.0.1"
gpus = 8
[hosts.g2]
address = "10.0.0.2"
gpus = 8
[models.big]
repo = "org/big"
gpus = [0, 1, 2, 3, 4, 5, 6, 7]
nodes = ["g1", "g2"]
tensor_parallel = 8
pipeline_parallel = 2
backend = "ray"
"""


@pytest.mark.parametrize(
    ("ray_args", "message"),
    [
        ('["--num-cpus", "4", "--port=7000"]', "models.big.ray_args[2]: '--port=7000': the Ray units render --port"),
        (
            '["--num-gpus", "2"]',
            "models.big.ray_args[0]: '--num-gpus': the Ray units render --num-gpus from the model's `gpus`",
        ),
    ],
)
def test_ray_args_repeating_a_rendered_ray_start_option_are_refused(
    tmp_path: Path, ray_args: str, message: str
) -> None:
    """A `ray start` option the Ray units already render, repeated in ray_args (click takes the last), is refused."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(tmp_path, f"ray_args = {ray_args}\n", RAY)
    load(tmp_path, 'ray_args = ["--num-cpus", "4"]\n', RAY)


def test_ray_args_repeating_an_option_the_ray_units_fix_are_refused(tmp_path: Path) -> None:
    """--include-dashboard, rendered by the Ray units without a key (Ray refuses it on workers), is refused."""
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "models.big.ray_args[0]: '--include-dashboard': the Ray units render --include-dashboard themselves"
        ),
    ):
        load(tmp_path, 'ray_args = ["--include-dashboard", "true"]\n', RAY)


NATIVE = RAY.replace('backend = "ray"\n', "")


@pytest.mark.parametrize(
    ("base", "arg", "flag", "key"),
    [
        (NATIVE, "--node-rank=1", "--node-rank", "the model's `nodes` (their order"),
        (NATIVE, "--headless", "--headless", "the model's `nodes` (their order"),
        (NATIVE, "--nnodes", "--nnodes", "the model's `nodes` (their count)"),
        (NATIVE, "--master-port", "--master-port", "the model's `master_port`"),
        (NATIVE, "--master-addr", "--master-addr", "the first node's address"),
        (NATIVE, "--data-parallel-rpc-port", "--data-parallel-rpc-port", "the model's `master_port`"),
        (
            NATIVE,
            "--data-parallel-size-local",
            "--data-parallel-size-local",
            "the model's `data_parallel` over its `nodes`",
        ),
        (NATIVE, "--data-parallel-start-rank", "--data-parallel-start-rank", "the model's `nodes` (their order"),
        (NATIVE, "--data-parallel-address", "--data-parallel-address", "the first node's address"),
        (RAY, "--distributed-executor-backend=mp", "--distributed-executor-backend", "the model's `backend`"),
        (NATIVE, "--distributed-executor-backend", "--distributed-executor-backend", "the model's `backend`"),
    ],
)
def test_args_repeating_a_per_node_flag_of_a_multi_node_model_are_refused(
    tmp_path: Path, base: str, arg: str, flag: str, key: str
) -> None:
    """A flag each node's unit renders (its place among the nodes, the backend), in a multi-node model's args, is
    refused naming the model, the key, the flag and the key to set instead."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, f'args = ["--trust-remote-code", "{arg}"]\n', base)
    message = str(err.value)
    assert (
        f"models.big.args[1]: '{arg}': model big spans nodes ['g1', 'g2'], whose units render {flag} for each "
        f"node from {key}"
        in message
        and message.endswith(": set that instead")
    )


def test_per_node_flags_are_left_to_a_one_box_model(tmp_path: Path) -> None:
    """A one-box model renders no per-node flag: its args may say --distributed-executor-backend (or --headless)."""
    load(tmp_path, 'args = ["--distributed-executor-backend", "mp", "--data-parallel-rpc-port", "13345"]\n')


@pytest.mark.parametrize(
    ("base", "arg", "read_as"),
    [
        (BASE + "max_model_len = 4096\n", "--max_model_len=8192", "--max-model-len"),
        (BASE, "--tensor-parallel=2", "--tensor-parallel-size"),
        (NATIVE, "--node_rank", "--node-rank"),
    ],
)
def test_other_spellings_of_a_rendered_flag_are_refused(tmp_path: Path, base: str, arg: str, read_as: str) -> None:
    """Underscores and a prefix the engine's parser completes name the rendered flag as surely as its own spelling."""
    with pytest.raises(ConfigError, match=re.escape(f"'{arg}' (vLLM's parser reads it as {read_as}): ")):
        load(tmp_path, f'args = ["{arg}"]\n', base)
