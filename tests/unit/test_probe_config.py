"""deploy.toml values a hostile new user's pass found accepted: each is refused at load with exit 2,
naming where it came from (the file or the variable), the key and the value, before anything runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.core.render import render_agent_unit
from orchestrator.errors import ConfigError
from orchestrator.resources import template_text

BASE = """{top}
[hosts.box]
gpus = 8
{host}
[models.a]
repo = "org/a"
port = 8000
gpus = [0, 1, 2, 3]
tensor_parallel = 4
{model}
{rest}"""


def write(tmp_path: Path, *, top: str = "", host: str = "", model: str = "", rest: str = "") -> Path:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(BASE.format(top=top, host=host, model=model, rest=rest))
    return cfg


def refused(cfg: Path) -> str:
    with pytest.raises(ConfigError) as info:
        settings.load(cfg)
    assert info.value.exit_code == 2
    return str(info.value)


@pytest.mark.parametrize(
    "where,line,key,words",
    [
        ("model", "port = true", "models.a.port", "must be an integer, not a boolean (got true)"),
        ("model", 'max_num_seqs = "64"', "models.a.max_num_seqs", "must be an integer, not a string (got '64')"),
        (
            "model",
            "expert_parallel = 1",
            "models.a.expert_parallel",
            "must be a boolean (true or false), not an integer",
        ),
        (
            "model",
            "gpu_memory_utilization = false",
            "models.a.gpu_memory_utilization",
            "must be a number, not a boolean",
        ),
        ("host", "gpu_memory_gib = true", "hosts.box.gpu_memory_gib", "must be a number, not a boolean"),
        ("host", "ssh_port = 22.0", "hosts.box.ssh_port", "must be an integer, not a float (got 22.0)"),
        ("rest", '[proxy]\nenabled = "yes"', "proxy.enabled", "must be a boolean (true or false), not a string"),
        ("top", "metrics_port = false", "metrics_port", "must be an integer, not a boolean"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused_not_coerced(
    tmp_path: Path, where: str, line: str, key: str, words: str
) -> None:
    """A boolean, a string or a float where another kind belongs is named, never coerced (true is not port 1)."""
    cfg = write(tmp_path, **{where: line})
    if line.startswith("port"):  # in place of the model's own port
        cfg.write_text(cfg.read_text().replace("port = 8000\n", "", 1))
    assert f"{cfg}: {key}: {words}" in refused(cfg)


def test_a_boolean_inside_a_gpu_list_is_named_by_its_index(tmp_path: Path) -> None:
    """`gpus = [0, true, 2, 3]` would be GPU 1 by coercion: refused, naming gpus[1]."""
    cfg = write(tmp_path)
    cfg.write_text(cfg.read_text().replace("gpus = [0, 1, 2, 3]", "gpus = [0, true, 2, 3]"))
    assert f"{cfg}: models.a.gpus[1]: must be an integer, not a boolean (got true)" in refused(cfg)


def test_a_json_table_from_the_environment_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A boolean for a number in a JSON override is refused naming the variable, not the file."""
    monkeypatch.setenv("ORCHESTRATOR_HOSTS", '{"box": {"gpus": true}}')
    assert refused(write(tmp_path)).startswith(
        "environment variable ORCHESTRATOR_HOSTS: hosts.box.gpus: must be an integer, not a boolean (got true)"
    )


def test_plain_environment_variables_still_override_numbers_and_booleans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variables are text by nature: ORCHESTRATOR_MODELS__A__PORT=8001 and ...ENABLED=true still take effect."""
    monkeypatch.setenv("ORCHESTRATOR_MODELS__A__PORT", "8001")
    monkeypatch.setenv("ORCHESTRATOR_POLICY__ROLLBACK_ON_FAILURE", "false")
    cat = settings.load(write(tmp_path))
    assert (cat.models["a"].port, cat.policy.rollback_on_failure) == (8001, False)


def test_a_file_value_an_environment_variable_replaces_is_not_held_against_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The environment wins: a wrong-kind value it overrides is not an error of the file."""
    monkeypatch.setenv("ORCHESTRATOR_MODELS__A__MAX_NUM_SEQS", "64")
    assert settings.load(write(tmp_path, model='max_num_seqs = "64"')).models["a"].max_num_seqs == 64


@pytest.mark.parametrize("group", ["-x", "--help", "a b", "Ops;id"])
def test_a_socket_group_that_is_not_a_group_name_is_refused(tmp_path: Path, group: str) -> None:
    """socket_group reaches groupadd and install -g as an argument: an option or two words are refused."""
    message = refused(write(tmp_path, top=f"socket_group = {group!r}"))
    assert f"socket_group: {group!r} is not a valid group name" in message


@pytest.mark.parametrize("user", ["-oProxyCommand=id", "a b", "root@evil", ""])
def test_an_ssh_user_that_is_not_a_login_name_is_refused(tmp_path: Path, user: str) -> None:
    """ssh_user is one login name: never an ssh option, a second word or an '@'."""
    assert f"hosts.box.ssh_user: ssh_user {user!r} is not a user name" in refused(
        write(tmp_path, host=f"ssh_user = {user!r}")
    )


@pytest.mark.parametrize("key", ["ssh_key", "known_hosts"])
def test_a_relative_ssh_file_is_refused(tmp_path: Path, key: str) -> None:
    """A relative key or known_hosts would depend on the working directory of whoever reads it."""
    assert f"hosts.box.{key}: {key} 'id_ed25519' is not an absolute path" in refused(
        write(tmp_path, host=f'{key} = "id_ed25519"')
    )


def test_ssh_files_under_home_are_accepted(tmp_path: Path) -> None:
    """`~/.ssh/...` is expanded where it is read, as the README's hosts.toml shows."""
    cat = settings.load(write(tmp_path, host='ssh_key = "~/.ssh/id_ed25519"\nknown_hosts = "/etc/ssh/kh"'))
    assert cat.hosts["box"].ssh_key == "~/.ssh/id_ed25519"


def test_a_state_dir_with_a_line_break_is_refused(tmp_path: Path) -> None:
    """state_dir reaches the proxy's config (its demand socket): a control character is refused at load."""
    assert "state_dir: state_dir '/var/lib/a\\nb' contains the control character" in refused(
        write(tmp_path, top='state_dir = "/var/lib/a\\nb"')
    )


@pytest.mark.parametrize(
    "top,rest,key",
    [
        (f'state_dir = "/var/lib/{"s" * 100}"', "", "state_dir"),
        ("", f'[dashboard]\nsocket = "/run/{"d" * 110}.sock"', "dashboard.socket"),
        ("", f'[proxy]\ndemand_socket = "/run/{"d" * 110}.sock"', "proxy.demand_socket"),
    ],
)
def test_a_socket_path_longer_than_sun_path_is_refused(tmp_path: Path, top: str, rest: str, key: str) -> None:
    """A Unix socket path past 107 bytes cannot be bound: refused at load, not when the agent starts."""
    message = refused(write(tmp_path, top=top, rest=rest))
    assert f"{key}: " in message and "a Unix socket path holds at most 107 (sun_path)" in message


def test_a_long_box_agent_socket_is_refused(tmp_path: Path) -> None:
    """A host's agent_socket (where a controller's relay connects) must fit a socket path too."""
    message = refused(write(tmp_path, host=f'agent_socket = "/var/lib/{"a" * 120}/agent.sock"'))
    assert "hosts.box.agent_socket: agent_socket" in message and "at most 107" in message


@pytest.mark.parametrize("key", ["batch", "max_failures"])
def test_a_group_count_past_any_fleet_is_refused(tmp_path: Path, key: str) -> None:
    """A group's batch or max_failures beyond 10,000 hosts is refused (SQLite holds 64-bit ints)."""
    rest = f'[groups.g]\nhosts = ["box"]\n{key} = 99999999999999999999'
    assert f"groups.g.{key}: Input should be less than or equal to 10000" in refused(write(tmp_path, rest=rest))


@pytest.mark.parametrize("python", ["/srv/my tools/é x/.venv/bin/python", "/opt/100%/bin/python"])
def test_the_agent_unit_runs_a_python_from_any_checkout_path(tmp_path: Path, python: str) -> None:
    """`render --agent` from a fresh clone in a directory with spaces or non-ASCII: ExecStart reads back as argv."""
    cat = settings.load(write(tmp_path))
    unit = render_agent_unit(
        cat, template_text("orchestrator-agent.service.j2"), python=python, config="/etc/my configs/deploy.toml"
    )
    line = next(x for x in unit.text.splitlines() if x.startswith("ExecStart="))
    words = [w.replace("%%", "%") for w in shlex.split(line.removeprefix("ExecStart="))]
    assert words == [python, "-m", "orchestrator", "agent", "--config", "/etc/my configs/deploy.toml"]


@pytest.mark.parametrize(
    "var,meant",
    [
        ("ORCHESTRATOR_STATE_DRI", "ORCHESTRATOR_STATE_DIR"),
        ("ORCHESTRATOR_DEFALTS__LOAD_DEADLINE_S", "ORCHESTRATOR_DEFAULTS__LOAD_DEADLINE_S"),
        ("ORCHESTRATOR_MODEL__A__PORT", "ORCHESTRATOR_MODELS__A__PORT"),
    ],
)
def test_a_misspelt_override_is_named_with_the_setting_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str, meant: str
) -> None:
    """A typo in an override's name would change nothing in silence: refused, naming the variable meant."""
    monkeypatch.setenv(var, "1200")
    assert (
        refused(write(tmp_path)) == f"environment variable {var}: not a setting (did you mean {meant}?); "
        "ORCHESTRATOR_<KEY> overrides a top-level key of deploy.toml, __ separates the parts of a key path"
    )


@pytest.mark.parametrize("var", ["ORCHESTRATOR_HOSTS_FILE", "ORCHESTRATOR_LOG_LEVEL", "ORCHESTRATOR_SOMETHING_ELSE"])
def test_the_tools_other_variables_and_unrelated_names_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    """Variables the tool reads for itself, and names like no setting, do not stop a load."""
    monkeypatch.setenv(var, "x")
    assert settings.load(write(tmp_path)).models["a"].port == 8000


@pytest.mark.parametrize("text", ["", "# only a comment\n\n"])
def test_an_empty_deploy_toml_says_it_is_empty(tmp_path: Path, text: str) -> None:
    """An empty file is named as empty with what it needs, not as a missing `hosts` field."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(text)
    assert (
        refused(cfg) == f"{cfg}: holds no settings (empty, or only comments): a deploy.toml needs at least one "
        "[hosts.NAME] table (the shipped deploy.toml is an example)"
    )
