"""deploy.toml's warm-switch settings: `sleep`, `wake_deadline_s`, a host's `platform`, `memory_gib`,
`sleep_ram_gib` and `sleep_residue_gib`; bad input exits 2 naming the key and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders.toml import Template

from .cli_runner import invoke

BASE = """
state_dir = "/var/lib/orchestrator"
[defaults]
bind = "127.0.0.1"
{defaults}
[hosts.box]
transport = "ssh"
address = "127.0.0.1"
gpus = 8
gpu_memory_gib = 141
{host}
[models.a]
repo = "org/a"
gpus = [0]
port = 8001
{model}
[models.b]
repo = "org/b"
gpus = [0]
port = 8002
{rest}
"""


DOC = Template(BASE)
load, refused = DOC.load, DOC.refused


def test_defaults_leave_sleep_mode_off(tmp_path: Path) -> None:
    """Unset, a model has no sleep mode, a 30 s wake deadline, and the host the measured residue."""
    cat = load(tmp_path)
    a, box = cat.models["a"], cat.hosts["box"]
    assert (a.sleep, a.wake_deadline_s, cat.defaults.wake_deadline_s) == (None, None, 30.0)
    assert (box.platform, box.memory_gib, box.sleep_ram_gib, box.sleep_residue_gib) == (None, None, None, 3.0)
    assert cat.platform_of(box) == "cuda"


def test_sleep_levels_and_host_budgets_load(tmp_path: Path) -> None:
    """`sleep` takes "level1" or "level2"; the host's RAM and residue keys load as given."""
    cat = load(
        tmp_path,
        model='sleep = "level1"\nwake_deadline_s = 12',
        rest='sleep = "level2"',
        host="memory_gib = 2048\nsleep_residue_gib = 2.5",
    )
    assert (cat.models["a"].sleep, cat.models["a"].wake_deadline_s, cat.models["b"].sleep) == ("level1", 12, "level2")
    assert cat.hosts["box"].sleep_residue_gib == 2.5


def test_ram_budget_is_memory_minus_the_reserve(tmp_path: Path) -> None:
    """Without sleep_ram_gib the budget is memory_gib less 10% (at least 16 GiB); unknown without either."""
    assert load(tmp_path, host="memory_gib = 2048").hosts["box"].sleep_ram_budget() == pytest.approx(2048 - 204.8)
    assert load(tmp_path, host="memory_gib = 64").hosts["box"].sleep_ram_budget() == 48
    assert load(tmp_path, host="memory_gib = 64\nsleep_ram_gib = 60").hosts["box"].sleep_ram_budget() == 60
    box = load(tmp_path).hosts["box"]
    assert (box.sleep_ram_budget(), box.sleep_ram_budget(probed_memory_gib=1024)) == (None, pytest.approx(921.6))


def test_an_unknown_sleep_value_is_refused(tmp_path: Path) -> None:
    """sleep = "deep": exit 2 naming the key and the value."""
    message = refused(tmp_path, model='sleep = "deep"')
    assert "models.a.sleep" in message and "'deep'" in message and "level1" in message


@pytest.mark.parametrize(
    ("host", "defaults", "cause"),
    [
        ('platform = "cpu"', "", 'hosts.box.platform = "cpu"'),
        (
            "",
            'engine = ["/opt/vllm-cpu/bin/python", "-m", "vllm.entrypoints.openai.api_server"]',
            "/opt/vllm-cpu/bin/python is vLLM's CPU build",
        ),
        ('engine = ["/opt/vllm-cpu/bin/vllm", "serve"]', "", "/opt/vllm-cpu/bin/vllm is vLLM's CPU build"),
    ],
)
def test_sleep_on_a_cpu_host_is_refused(tmp_path: Path, host: str, defaults: str, cause: str) -> None:
    """A CPU host (its platform, or vLLM's CPU build as its engine) cannot sleep: exit 2 naming both."""
    message = refused(tmp_path, host=host, defaults=defaults, model='sleep = "level2"')
    assert "models.a.sleep" in message and "'level2'" in message and "host box" in message and cause in message


def test_an_explicit_gpu_platform_wins_over_the_engine_path(tmp_path: Path) -> None:
    """platform = "cuda" on a host whose engine path says vllm-cpu: the operator's word counts."""
    cat = load(
        tmp_path, host='platform = "cuda"\nengine = ["/opt/vllm-cpu/bin/vllm", "serve"]', model='sleep = "level1"'
    )
    assert cat.platform_of(cat.hosts["box"]) == "cuda"


@pytest.mark.parametrize(
    ("host", "key", "value"),
    [
        ("sleep_ram_gib = 0", "hosts.box.sleep_ram_gib", "sleep_ram_gib 0"),
        ("memory_gib = 16", "hosts.box.memory_gib", "memory_gib 16"),
    ],
)
def test_a_ram_budget_that_cannot_hold_a_sleeper_is_refused(tmp_path: Path, host: str, key: str, value: str) -> None:
    """A level1 model on a host whose RAM budget is 0 GiB: exit 2 naming the host's key and value."""
    message = refused(tmp_path, host=host, model='sleep = "level1"')
    assert message.startswith(f"{key}: {value} leaves a RAM budget of 0 GiB") or f"{key}: {value}" in message
    assert "models.a.sleep" in message


def test_a_level2_sleeper_needs_no_ram_budget(tmp_path: Path) -> None:
    """level2 drops the weights: a 0 GiB budget is fine."""
    assert load(tmp_path, host="sleep_ram_gib = 0", model='sleep = "level2"').models["a"].sleep == "level2"


@pytest.mark.parametrize(
    ("defaults", "host", "key", "bind"),
    [
        ('bind = "0.0.0.0"', "", "defaults.bind", "'0.0.0.0'"),
        ("", 'bind = "10.1.2.3"', "hosts.box.bind", "'10.1.2.3'"),
        ("", 'bind = "::"', "hosts.box.bind", "'::'"),
    ],
)
def test_a_sleep_engine_on_a_public_address_without_the_proxy_is_refused(
    tmp_path: Path, defaults: str, host: str, key: str, bind: str
) -> None:
    """Dev endpoints on a non-loopback address with no front proxy: exit 2 naming the model, bind key and value."""
    message = Template(BASE.replace('[defaults]\nbind = "127.0.0.1"\n', "[defaults]\n")).refused(
        tmp_path, defaults=defaults, host=host, model='sleep = "level1"'
    )
    assert "models.a.sleep" in message and f"{key} = {bind}" in message and "[proxy] enabled = true" in message


def test_a_sleep_engine_on_a_public_address_behind_the_proxy_loads(tmp_path: Path) -> None:
    """With the proxy on, a public bind is fine: the engine listens on loopback behind it."""
    cat = load(
        tmp_path, host='bind = "10.1.2.3"', model='sleep = "level1"', rest="[proxy]\nenabled = true\nport = 9000"
    )
    assert cat.models["a"].sleep == "level1"


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ('env = { VLLM_SERVER_DEV_MODE = "1" }', "models.a.env.VLLM_SERVER_DEV_MODE"),
        ('args = ["--max-num-batched-tokens", "8192", "--enable-sleep-mode"]', "models.a.args[2]"),
    ],
)
def test_dev_mode_by_hand_is_refused(tmp_path: Path, model: str, key: str) -> None:
    """VLLM_SERVER_DEV_MODE in env or --enable-sleep-mode in args bypass `sleep`'s guards: exit 2 naming it."""
    message = refused(tmp_path, model=model)
    assert key in message and "sleep" in message


def test_sleep_on_a_multinode_model_is_refused(tmp_path: Path) -> None:
    """Warm switches are for one box: a multi-node model with sleep exits 2 naming it."""
    rest = (
        'host = "box"\n[hosts.box2]\naddress = "127.0.0.2"\ngpus = 8\n'
        '[models.big]\nrepo = "org/big"\nnodes = ["box", "box2"]\ngpus = [2]\npipeline_parallel = 2\nport = 8050\n'
        'sleep = "level2"\n'
    )
    message = refused(tmp_path, model='host = "box"', rest=rest)
    assert "models.big.sleep" in message and "multi-node" in message


@pytest.mark.parametrize(
    ("host", "key", "words"),
    [
        (
            "memory_gib = 512\nsleep_ram_gib = 600",
            "hosts.box.sleep_ram_gib",
            "sleep_ram_gib 600 is more than the host's memory_gib 512",
        ),
        (
            "sleep_residue_gib = 141",
            "hosts.box.sleep_residue_gib",
            "sleep_residue_gib 141 is not less than gpu_memory_gib 141",
        ),
    ],
)
def test_host_budgets_that_cannot_be_are_refused(tmp_path: Path, host: str, key: str, words: str) -> None:
    """A RAM budget over the box's memory, a residue of a whole GPU: exit 2 naming the key and values."""
    message = refused(tmp_path, host=host)
    assert f"{key}: {words}" in message


def test_a_sleep_model_on_a_gpu_no_larger_than_the_residue_is_refused(tmp_path: Path) -> None:
    """gpu_memory_gib 2 with the default 3 GiB residue: a sleep model there exits 2 naming the residue key."""
    message = Template(BASE.replace("gpu_memory_gib = 141", "gpu_memory_gib = 2")).refused(
        tmp_path, model='sleep = "level2"'
    )
    assert "hosts.box.sleep_residue_gib: sleep_residue_gib 3" in message and "gpu_memory_gib 2" in message


def test_the_cli_exits_2_naming_the_file_key_and_value(tmp_path: Path) -> None:
    """Through the real CLI: sleep on a CPU host exits 2 with one line naming the file, key and value."""
    path = DOC.write(tmp_path, host='platform = "cpu"', model='sleep = "level1"')
    r = invoke("plan", "--config", str(path), "a")
    assert r.exit_code == 2
    assert f"{tmp_path / 'deploy.toml'}: models.a.sleep: sleep 'level1': host box cannot sleep" in r.output
