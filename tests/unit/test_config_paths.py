"""Socket paths in deploy.toml: one word of plain characters, never traversing, and one path per socket
(the agent's own agent.sock and demand.sock included); each refusal exits 2 naming the key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_probe_config import refused, write


@pytest.mark.parametrize(
    "rest,key,value",
    [
        ('[dashboard]\nsocket = "/tmp/../etc/x.sock"', "dashboard.socket", "/tmp/../etc/x.sock"),
        ('[dashboard]\nsocket = "/run/./d.sock"', "dashboard.socket", "/run/./d.sock"),
        ('[dashboard]\nsocket = "/etc/victim-file"', "dashboard.socket", "/etc/victim-file"),
        ('[dashboard]\nsocket = "/run/d d.sock"', "dashboard.socket", "/run/d d.sock"),
        ('[proxy]\ndemand_socket = "/run//d.sock"', "proxy.demand_socket", "/run//d.sock"),
    ],
)
def test_a_traversing_or_odd_socket_path_is_refused(tmp_path: Path, rest: str, key: str, value: str) -> None:
    """'..' or '.' parts, '//', spaces or no '.sock': refused at load, naming the key and the value."""
    message = refused(write(tmp_path, rest=rest))
    assert f"{key}: " in message and repr(value) in message


@pytest.mark.parametrize(
    "value", ["/run/a.sock;id", "/run/$(id).sock", "/run/a b.sock", "/run/../etc/a.sock", "/run/`id`.sock"]
)
def test_a_box_agent_socket_with_shell_characters_is_refused(tmp_path: Path, value: str) -> None:
    """A host's agent_socket reaches the relay's command line: ';', '$(...)', spaces or '..' are refused."""
    message = refused(write(tmp_path, host=f"agent_socket = {value!r}".replace("'", '"')))
    assert "hosts.box.agent_socket: " in message and repr(value) in message


@pytest.mark.parametrize(
    "top,rest,key,other",
    [
        (
            'state_dir = "/var/lib/o"',
            '[dashboard]\nsocket = "/var/lib/o/agent.sock"',
            "dashboard.socket",
            "the agent's socket",
        ),
        ("", '[dashboard]\nsocket = "/run/orchestrator/demand.sock"', "dashboard.socket", "the default demand socket"),
        (
            'state_dir = "/var/lib/o"',
            '[proxy]\ndemand_socket = "/var/lib/o/agent.sock"',
            "proxy.demand_socket",
            "the agent's socket",
        ),
        (
            'state_dir = "/var/lib/o"',
            '[proxy]\ndemand_socket = "/var/lib/o/dashboard.sock"',
            "proxy.demand_socket",
            "the dashboard's socket",
        ),
        (
            "",
            '[proxy]\ndemand_socket = "/run/orchestrator-proxy/admin.sock"',
            "proxy.demand_socket",
            "proxy.stats_socket",
        ),
        (
            "",
            '[proxy]\ndemand_socket = "/run/orchestrator-proxy/master.sock"',
            "proxy.demand_socket",
            "HAProxy's master socket",
        ),
        (
            "",
            '[proxy]\ndemand_socket = "/run/d.sock"\n[dashboard]\nsocket = "/run/d.sock"',
            "dashboard.socket",
            "proxy.demand_socket",
        ),
    ],
)
def test_two_sockets_at_one_path_are_refused(tmp_path: Path, top: str, rest: str, key: str, other: str) -> None:
    """A socket at another socket's path is refused naming the key, the path and the other socket."""
    message = refused(write(tmp_path, top=top, rest=rest))
    assert f"{key}: " in message and other in message and "give each socket a path of its own" in message


@pytest.mark.parametrize(
    "where,line,key",
    [
        ("top", 'state_dir = "/var/lib/../../etc"', "state_dir"),
        ("host", 'models_dir = "/models/../etc"', "hosts.box.models_dir"),
        ("host", 'unit_dir = "/etc/systemd/system/../../cron.d"', "hosts.box.unit_dir"),
        ("host", 'python = "/usr/bin/./python3"', "hosts.box.python"),
        ("rest", '[defaults]\nenv_dir = "/etc/orchestrator/../../root"', "defaults.env_dir"),
        (
            "rest",
            '[hosts.b2]\ngpus = 8\n[groups.g]\nhosts = ["box", "b2"]\npeer_key = "/etc/orchestrator/../../root/k"',
            "groups.g.peer_key",
        ),
    ],
)
def test_a_directory_root_writes_under_with_a_dot_part_is_refused(
    tmp_path: Path, where: str, line: str, key: str
) -> None:
    """'.' or '..' in a path root writes or runs under is refused, not resolved: the real path is named."""
    assert f"{key}: " in refused(write(tmp_path, **{where: line}))
