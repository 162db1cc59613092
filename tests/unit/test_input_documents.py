"""Hostile documents (deep nesting, binary bytes, huge numbers, duplicate keys) at every place the
product reads TOML or JSON from a user: one error naming the file, exit 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import Result

from orchestrator import settings
from orchestrator.agent import relay
from orchestrator.client.targets import load_hosts
from orchestrator.core.documents import MAX_DEPTH, DocumentError, json_document, toml_document
from orchestrator.errors import ConfigError

from .cli_runner import invoke

DEEP_TOML = "x = " + "[" * 5000 + "]" * 5000 + "\n"
DEEP_JSON = "[" * 100_000 + "]" * 100_000
BINARY = b"\x89PNG\r\n\x1a\n\xff\xfe\x00junk"
HUGE_INT = "x = " + "9" * 5000 + "\n"
HOSTILE_TOML = {
    "deep": DEEP_TOML.encode(),
    "binary": BINARY,
    "huge int": HUGE_INT.encode(),
    "huge float": b"x = 1e999\n",
    "nested past the bound": ("x = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n").encode(),
}
HOSTILE_JSON = {
    "deep": DEEP_JSON.encode(),
    "binary": BINARY,
    "huge int": b"9" * 5000,
    "huge float": b"[1e999]",
    "NaN": b"[NaN]",
    "duplicate key": b'{"a": 1, "a": 2}',
}
# A config.json is read as vLLM reads it (duplicate keys: the last wins); everything else is refused.
HOSTILE_CONFIG_JSON = {k: v for k, v in HOSTILE_JSON.items() if k != "duplicate key"}
DEPLOY = """
state_dir = "/var/lib/orchestrator"
[hosts.box]
transport = "ssh"
address = "127.0.0.1"
gpus = 2
[models.a]
repo = "org/a"
gpus = [0]
config = "config.json"
"""


def run(*args: str) -> Result:
    return invoke(*args)


def assert_exit_2_naming(result: Result, name: str) -> None:
    assert result.exit_code == 2, (result.output, result.exception)
    assert name in result.output and "Traceback" not in result.output, result.output


@pytest.mark.parametrize("raw", HOSTILE_TOML.values(), ids=HOSTILE_TOML.keys())
def test_hostile_toml_is_one_document_error(raw: bytes) -> None:
    """Each hostile TOML document becomes one DocumentError naming where it came from."""
    with pytest.raises(DocumentError, match=r"^here\.toml: "):
        toml_document(raw, "here.toml")


@pytest.mark.parametrize("raw", HOSTILE_JSON.values(), ids=HOSTILE_JSON.keys())
def test_hostile_json_is_one_document_error(raw: bytes) -> None:
    """Each hostile JSON document becomes one DocumentError naming where it came from."""
    with pytest.raises(DocumentError, match=r"^here\.json: "):
        json_document(raw, "here.json")


def test_a_huge_number_is_quoted_cut_short() -> None:
    """The message quotes at most the first characters of a huge value, with its length."""
    with pytest.raises(DocumentError) as info:
        json_document(b"[1" + b"0" * 400 + b"e999]", "here.json")
    assert len(str(info.value)) < 200 and "characters" in str(info.value)


def test_duplicate_keys_from_the_hub_are_read_as_python_does() -> None:
    """With unique_keys off (a downloaded config.json) the last key wins, as vLLM reads it."""
    assert json_document(b'{"a": 1, "a": 2}', "config.json", unique_keys=False) == {"a": 2}


@pytest.mark.parametrize("raw", HOSTILE_TOML.values(), ids=HOSTILE_TOML.keys())
def test_hostile_deploy_toml_is_a_config_error_naming_the_file(tmp_path: Path, raw: bytes) -> None:
    """deploy.toml: ConfigError naming the file."""
    (tmp_path / "deploy.toml").write_bytes(raw)
    with pytest.raises(ConfigError, match="deploy.toml"):
        settings.load(tmp_path / "deploy.toml")


@pytest.mark.parametrize("raw", HOSTILE_CONFIG_JSON.values(), ids=HOSTILE_CONFIG_JSON.keys())
def test_hostile_model_config_is_a_config_error_naming_key_and_file(tmp_path: Path, raw: bytes) -> None:
    """A model's `config` file: ConfigError naming models.a.config and the JSON file."""
    (tmp_path / "deploy.toml").write_text(DEPLOY)
    (tmp_path / "config.json").write_bytes(raw)
    with pytest.raises(ConfigError, match=r"models\.a\.config: .*config\.json"):
        settings.load(tmp_path / "deploy.toml")


@pytest.mark.parametrize("raw", HOSTILE_TOML.values(), ids=HOSTILE_TOML.keys())
def test_hostile_hosts_toml_is_a_config_error_naming_the_file(tmp_path: Path, raw: bytes) -> None:
    """hosts.toml: ConfigError naming the file."""
    (tmp_path / "hosts.toml").write_bytes(raw)
    with pytest.raises(ConfigError, match="hosts.toml"):
        load_hosts(tmp_path / "hosts.toml")


@pytest.mark.parametrize("raw", HOSTILE_TOML.values(), ids=HOSTILE_TOML.keys())
def test_the_relay_falls_back_to_the_default_socket_on_a_hostile_deploy_toml(
    tmp_path: Path, raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay reads state_dir cheaply; an unreadable deploy.toml means the default place, no traceback."""
    monkeypatch.delenv("ORCHESTRATOR_SOCKET", raising=False)
    (tmp_path / "deploy.toml").write_bytes(raw)
    assert relay.default_socket(str(tmp_path / "deploy.toml")) == "/var/lib/orchestrator/agent.sock"


def test_config_diff_of_a_binary_file_names_it(tmp_path: Path) -> None:
    """`config diff BINARY`: exit 2 naming the file, before any agent is asked."""
    (tmp_path / "blob").write_bytes(BINARY)
    assert_exit_2_naming(run("config", "diff", str(tmp_path / "blob")), "blob: not UTF-8 text")


@pytest.mark.parametrize("raw", HOSTILE_CONFIG_JSON.values(), ids=HOSTILE_CONFIG_JSON.keys())
def test_plan_with_a_hostile_config_json_names_it(tmp_path: Path, raw: bytes) -> None:
    """`plan --config FILE.json`: exit 2 naming the file."""
    (tmp_path / "c.json").write_bytes(raw)
    assert_exit_2_naming(
        run("plan", "--config", str(tmp_path / "c.json"), "--gpus", "8", "--gpu-memory-gib", "80"), "c.json"
    )


@pytest.mark.parametrize("raw", HOSTILE_CONFIG_JSON.values(), ids=HOSTILE_CONFIG_JSON.keys())
def test_tune_with_a_hostile_model_config_names_it(tmp_path: Path, raw: bytes) -> None:
    """`tune --model-config FILE`: exit 2 naming the option and the file, before any host is read."""
    (tmp_path / "c.json").write_bytes(raw)
    (tmp_path / "deploy.toml").write_text(DEPLOY.replace('config = "config.json"\n', ""))
    assert_exit_2_naming(
        run(
            "tune", "a", "--config", str(tmp_path / "deploy.toml"), "--model-config", str(tmp_path / "c.json"), "--yes"
        ),
        "--model-config",
    )


@pytest.mark.parametrize("raw", HOSTILE_TOML.values(), ids=HOSTILE_TOML.keys())
def test_agent_install_with_a_hostile_config_names_it(tmp_path: Path, raw: bytes) -> None:
    """`agent install --config FILE` (binary, nested past the bound ...): exit 2 naming the file, before any SSH."""
    (tmp_path / "deploy.toml").write_bytes(raw)
    assert_exit_2_naming(
        run("agent", "install", "ssh://root@127.0.0.1:1", "--config", str(tmp_path / "deploy.toml")), "deploy.toml"
    )


def test_json_round_trip_of_ordinary_documents_is_unchanged() -> None:
    """Ordinary documents parse as json.loads would."""
    doc = {"a": [1, 2.5, {"b": None}], "c": "d", "e": -3}
    assert json_document(json.dumps(doc).encode(), "x.json") == doc


def test_config_push_of_a_file_past_the_request_limit_names_it(tmp_path: Path) -> None:
    """`config push BIG`: exit 2 naming the file and the agent's 64 KiB limit, before any agent is asked."""
    (tmp_path / "big.toml").write_text("# padding\n" * 7000)
    assert_exit_2_naming(run("config", "push", str(tmp_path / "big.toml")), "big.toml: 70,000 bytes: too large")


@pytest.mark.parametrize("raw", HOSTILE_CONFIG_JSON.values(), ids=HOSTILE_CONFIG_JSON.keys())
def test_a_hostile_config_json_on_the_host_is_a_plan_error_naming_it(raw: bytes) -> None:
    """The switch's preflight reads the staged config.json: a PlanError naming the file, no traceback."""
    from orchestrator.deploy.preflight import _read_json
    from orchestrator.errors import PlanError

    from .conftest import World

    world = World()
    world.host.files["/models/x/config.json"] = raw
    with pytest.raises(PlanError, match="/models/x/config.json: "):
        _read_json(world.host.ports(world.catalog.hosts["box"], world.weights), "/models/x/config.json")


@pytest.mark.parametrize("text", [DEEP_TOML, HUGE_INT], ids=["deep", "huge int"])
def test_tune_apply_refuses_an_edit_that_would_not_parse(text: str) -> None:
    """tune --apply's check of the edited deploy.toml: a usage error naming the file, no traceback."""
    from orchestrator.core.tune_toml import _check
    from orchestrator.errors import UsageError

    with pytest.raises(UsageError, match=r"deploy\.toml: the edited \[models\.a\] would not parse"):
        _check(text, "a", {"tensor_parallel": 2}, "deploy.toml")


@pytest.mark.parametrize(
    "value",
    ["[" * 5000 + "]" * 5000, '{"box": {"gpus": 1, "gpus": 2}}', "[" + "9" * 5000 + "]"],
    ids=["deep", "duplicate key", "huge int"],
)
def test_a_hostile_json_override_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """ORCHESTRATOR_HOSTS holding hostile JSON: a ConfigError naming the variable, no traceback."""
    (tmp_path / "deploy.toml").write_text(DEPLOY.replace('config = "config.json"\n', ""))
    monkeypatch.setenv("ORCHESTRATOR_HOSTS", value)
    with pytest.raises(ConfigError, match="environment variable ORCHESTRATOR_HOSTS"):
        settings.load(tmp_path / "deploy.toml")


@pytest.mark.parametrize(
    ("key", "value"), [("key", "rel/id_ed25519"), ("known_hosts", "known_hosts"), ("key", "/k\\nx")]
)
def test_hosts_toml_ssh_file_relative_or_multiline_is_refused(tmp_path: Path, key: str, value: str) -> None:
    """hosts.toml's key/known_hosts, like deploy.toml's: relative or not one printable line is exit 2 naming the key."""
    (tmp_path / "hosts.toml").write_text(f'[gpu1]\nurl = "ssh://root@gpu1.lan"\n{key} = "{value}"\n')
    with pytest.raises(ConfigError, match=rf"hosts\.toml: gpu1\.{key}: {key} .* must be an absolute path"):
        load_hosts(tmp_path / "hosts.toml")
    (tmp_path / "hosts.toml").write_text(f'[gpu1]\nurl = "ssh://root@gpu1.lan"\n{key} = "~/.ssh/x"\n')
    assert load_hosts(tmp_path / "hosts.toml")["gpu1"].address == "gpu1.lan"
