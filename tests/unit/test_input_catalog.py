"""deploy.toml values from the review that were accepted: each is refused at load with exit 2, naming
the file, the key and the bad value (colliding ports of every kind, 6- and 7-field crons, non-ASCII
digits, engines as root, relative directories, unservable served names, a canary larger than its group)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.errors import ConfigError
from tests.builders.toml import Template

BASE = """
state_dir = "/var/lib/orchestrator"
{top}
[hosts.box]
transport = "ssh"
address = "127.0.0.1"
gpus = 8
[hosts.box2]
transport = "ssh"
address = "127.0.0.2"
gpus = 8
[models.a]
host = "box"
repo = "org/a"
gpus = [0]
port = 8000
[models.b]
host = "box"
repo = "org/b"
gpus = [1]
port = 8001
{rest}
"""
BIG = (
    '[models.big]\nrepo = "org/big"\nnodes = ["box", "box2"]\ngpus = [2, 3]\ntensor_parallel = 2\n'
    "pipeline_parallel = 2\nport = 8050\n"
)


DOC = Template(BASE)
load, refused = DOC.load, DOC.refused


@pytest.mark.parametrize(
    ("top", "rest", "key", "words"),
    [
        (
            "metrics_port = 8001",
            "",
            "models.b.port",
            ["port 8001 is the agent's metrics port on host box (metrics_port)"],
        ),
        (
            "",
            BIG + "master_port = 8001\n",
            "models.big.master_port",
            ["port 8001 is already used by model b on host box (models.b.port)"],
        ),
        ("", BIG + 'backend = "ray"\nray_port = 9464\n', "models.big.ray_port", ["port 9464", "metrics_port"]),
        ("", BIG + "[proxy]\nenabled = true\nport = 29500\n", "models.big.master_port", ["port 29500", "proxy.port"]),
        ("", BIG.replace("port = 8050", "port = 29500"), "models.big.master_port", ["port 29500", "models.big.port"]),
        ("", "[proxy]\nenabled = true\nport = 8001\n", "models.b.port", ["port 8001", "proxy.port"]),
        (
            "",
            BIG + '[models.big2]\nrepo = "org/big2"\nnodes = ["box", "box2"]\ngpus = [4, 5]\ntensor_parallel = 2\n'
            "pipeline_parallel = 2\nport = 8100\n",
            "models.big2.master_port",
            ["port 29500", "models.big.master_port"],
        ),
    ],
)
def test_a_port_taken_twice_on_a_host_is_refused(
    tmp_path: Path, top: str, rest: str, key: str, words: list[str]
) -> None:
    """Every kind of port (engine, master, Ray, metrics, proxy) is once per host: exit 2 naming both keys."""
    message = refused(tmp_path, top=top, rest=rest)
    assert "deploy.toml" in message and key in message, message
    assert all(w in message for w in words), message


def test_rendezvous_ports_of_models_that_share_gpus_may_coincide(tmp_path: Path) -> None:
    """Two multi-node models on the same GPUs never run at once: the same master_port is accepted."""
    other = BIG.replace("[models.big]", "[models.big2]").replace('"org/big"', '"org/big2"').replace("8050", "8100")
    load(tmp_path, rest=BIG + other)


@pytest.mark.parametrize(
    ("rest", "key", "words"),
    [
        ('[schedules.s]\ncron = "* * * * * *"\nmodel = "a"\n', "schedules.s.cron", ["6 fields", "exactly 5"]),
        ('[schedules.s]\ncron = "0 0 1 1 * 0 2001"\nmodel = "a"\n', "schedules.s.cron", ["7 fields"]),
        ('[schedules.s]\ncron = "\u0665 * * * *"\nmodel = "a"\n', "schedules.s.cron", ["ASCII digits"]),
        (
            '[schedules.s]\ncron = "0 3 * * *"\nmodel = "a"\nwindow = "\u0660\u0661:00-05:00"\n',
            "schedules.s.window",
            ["HH:MM-HH:MM"],
        ),
    ],
)
def test_a_cron_or_window_outside_the_classic_form_is_refused(
    tmp_path: Path, rest: str, key: str, words: list[str]
) -> None:
    """Cron has exactly 5 fields of ASCII characters; a window ASCII digits: exit 2 naming the key."""
    message = refused(tmp_path, rest=rest)
    assert key in message and all(w in message for w in words), message


def test_engines_as_root_are_refused(tmp_path: Path) -> None:
    """`user = "root"` in [defaults]: exit 2 naming defaults.user and the way out for a test bed."""
    assert re.search(
        r"deploy\.toml: defaults\.user: 'root' is refused.*allow_root",
        refused(tmp_path, top='[defaults]\nuser = "root"'),
    )


def test_engines_as_root_are_accepted_on_a_declared_test_bed(tmp_path: Path) -> None:
    """`allow_root = true` next to it says the box is disposable: accepted."""
    load(tmp_path, top='[defaults]\nuser = "root"\ngroup = "root"\nallow_root = true')


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        (BASE.replace('state_dir = "/var/lib/orchestrator"', 'state_dir = "state"'), "state_dir"),
        (
            BASE.replace("gpus = 8\n[hosts.box2]", 'gpus = 8\nmodels_dir = "models"\n[hosts.box2]'),
            "hosts.box.models_dir",
        ),
        (BASE.replace("gpus = 8\n[hosts.box2]", 'gpus = 8\nunit_dir = "units"\n[hosts.box2]'), "hosts.box.unit_dir"),
        (BASE.replace("gpus = 8\n[hosts.box2]", 'gpus = 8\npython = "python3"\n[hosts.box2]'), "hosts.box.python"),
        (BASE.replace("{top}", '[defaults]\nray = "ray"'), "defaults.ray"),
    ],
)
def test_a_relative_directory_or_executable_is_refused(tmp_path: Path, doc: str, key: str) -> None:
    """Paths the agent and systemd use are absolute: exit 2 naming the key and the value."""
    assert re.search(rf"deploy\.toml: {key}: .* is not an absolute path", Template(doc).refused(tmp_path))


@pytest.mark.parametrize(
    ("served", "words"),
    [
        ("x" * (1024 * 1024), ["1,048,576 characters", "longer than 4096"]),
        ("x" * 129, ["(129 characters)", "at most 128"]),
        ("two words", ["'two words'", "no spaces"]),
    ],
)
def test_a_served_name_systemd_or_haproxy_cannot_take_is_refused(tmp_path: Path, served: str, words: list[str]) -> None:
    """Without the proxy too: exit 2 naming models.a.served_name, the value cut short."""
    message = Template(BASE.replace('repo = "org/a"', f'repo = "org/a"\nserved_name = "{served}"')).refused(tmp_path)
    assert "models.a.served_name" in message and all(w in message for w in words) and len(message) < 600, message[:300]


@pytest.mark.parametrize(
    ("canary", "words"),
    [(3, ["canary 3 is larger than the group's 2 hosts"]), (2, ["canary 2 is all of the group's 2 hosts"])],
)
def test_a_canary_larger_than_its_group_is_refused(tmp_path: Path, canary: int, words: list[str]) -> None:
    """groups.g.canary past the group's hosts: exit 2 naming the key, the value and the hosts."""
    message = refused(tmp_path, rest=f'[groups.g]\nhosts = ["box", "box2"]\ncanary = {canary}\n')
    assert "groups.g.canary" in message and all(w in message for w in words), message


def test_a_one_host_group_keeps_its_default_canary(tmp_path: Path) -> None:
    """A group of one host with the default canary 1 is what `rollout` accepts too."""
    load(tmp_path, rest='[groups.g]\nhosts = ["box"]\n')


def test_a_push_cannot_turn_on_engines_as_root(tmp_path: Path) -> None:
    """config push of a file with allow_root = true over one without: exit 2 naming the key, file untouched."""
    from orchestrator.agent.config_ops import ConfigRevisions

    (tmp_path / "deploy.toml").write_text(BASE.format(top="", rest=""))
    running = settings.load(tmp_path / "deploy.toml")
    pushed = BASE.format(top='[defaults]\nuser = "root"\ngroup = "root"\nallow_root = true', rest="")
    revisions = ConfigRevisions(tmp_path / "deploy.toml", str(tmp_path / "state"), group=None)
    with pytest.raises(ConfigError, match=r"new\.toml: defaults\.allow_root: a push cannot turn on engines as root"):
        revisions.validate(pushed, "new.toml", running, now=0.0)
    assert (tmp_path / "deploy.toml").read_text() == BASE.format(top="", rest="")


def test_args_too_long_for_one_unit_line_are_refused(tmp_path: Path) -> None:
    """1,000 arguments of 100 characters: exit 2 naming models.a.args and the total, before any unit is written."""
    args = ", ".join(f'"--x{i}={"v" * 94}"' for i in range(1000))
    assert re.search(
        r"models\.a\.args: 1000 arguments of 101,890 characters in all",
        Template(BASE.replace('repo = "org/a"', f'repo = "org/a"\nargs = [{args}]')).refused(tmp_path),
    )
