"""`--host` input that cannot work: one line naming the host and what failed, the documented exit code."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.client.targets import Target, parse_url, resolve
from orchestrator.errors import ConfigError, UsageError


def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ORCHESTRATOR_HOSTS_FILE": str(tmp_path / "hosts.toml")}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_url_with_user_and_port_parses() -> None:
    """ssh://user@box:port gives user, address and port; the user defaults to root."""
    assert parse_url("ssh://ops@10.0.0.5:2222") == Target(
        name="ssh://ops@10.0.0.5:2222", address="10.0.0.5", port=2222, user="ops"
    )
    assert parse_url("ssh://gpu1").user == "root"


@pytest.mark.parametrize("bad", ["http://box", "ssh://", "ssh://box:99999", "ssh://box/path"])
def test_bad_url_is_a_usage_error_naming_it(bad: str) -> None:
    """Anything but ssh://[user@]host[:port] is refused, quoting the value."""
    with pytest.raises(UsageError, match="--host"):
        parse_url(bad)


def test_named_host_comes_from_the_hosts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A [gpu1] table gives the URL, key, known_hosts, python and socket of --host gpu1."""
    (tmp_path / "hosts.toml").write_text(
        '[gpu1]\nurl = "ssh://ops@10.0.0.5:2222"\nkey = "~/k"\npython = "/opt/o/bin/python"\nsocket = "/run/a.sock"\n'
    )
    monkeypatch.setenv("ORCHESTRATOR_HOSTS_FILE", str(tmp_path / "hosts.toml"))
    target = resolve("gpu1")
    assert (target.address, target.port, target.user, target.socket) == ("10.0.0.5", 2222, "ops", "/run/a.sock")
    assert target.key == str(Path.home() / "k")
    assert target.relay_command() == "/opt/o/bin/python -m orchestrator.agent.relay --socket /run/a.sock"


def test_unknown_key_in_hosts_file_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt key is named with its table and the file."""
    (tmp_path / "hosts.toml").write_text('[gpu1]\nurl = "ssh://root@10.0.0.5"\nkeyfile = "x"\n')
    monkeypatch.setenv("ORCHESTRATOR_HOSTS_FILE", str(tmp_path / "hosts.toml"))
    with pytest.raises(ConfigError, match="hosts.toml: gpu1: unknown key 'keyfile'"):
        resolve("gpu1")


def test_unknown_alias_exits_2_naming_it_and_the_file(tmp_path: Path) -> None:
    """--host gpu9 with no such name: exit 2, one line naming gpu9 and the hosts file."""
    (tmp_path / "hosts.toml").write_text('[gpu1]\nurl = "ssh://root@10.0.0.5"\n')
    result = cli(tmp_path, "--host", "gpu9", "switch", "alpha")
    assert result.returncode == 2
    line = one_line(result)
    assert "unknown host 'gpu9'" in line and str(tmp_path / "hosts.toml") in line and "gpu1" in line


def test_orchestrator_host_variable_is_used(tmp_path: Path) -> None:
    """$ORCHESTRATOR_HOST works like --host (here: an unknown name, refused the same way)."""
    result = cli(tmp_path, "history", env={"ORCHESTRATOR_HOST": "nowhere"})
    assert result.returncode == 2 and "unknown host 'nowhere'" in one_line(result)


def test_unreachable_box_exits_4_naming_it(tmp_path: Path) -> None:
    """Nothing listens on the box's SSH port: exit 4, one line naming the host and 'refused'."""
    with socket.socket() as probe:  # a loopback port that is certainly closed: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        result = cli(tmp_path, "--host", f"ssh://root@127.0.0.1:{port}", "status")
    assert result.returncode == 4
    line = one_line(result)
    assert f"root@127.0.0.1:{port}" in line and "refused" in line


def test_config_and_host_together_are_refused(tmp_path: Path) -> None:
    """--config names a local file; with --host the box's own configuration rules: exit 2."""
    result = cli(tmp_path, "--host", "ssh://root@127.0.0.1:1", "switch", "alpha", "--config", "x.toml")
    assert result.returncode == 2 and "box's own deploy.toml" in one_line(result)


def test_bench_refuses_host_instead_of_running_locally(tmp_path: Path) -> None:
    """bench does not go through the agent yet: --host is refused, not silently ignored."""
    result = cli(tmp_path, "--host", "ssh://root@127.0.0.1:1", "bench")
    assert result.returncode == 2 and "bench does not go through the agent" in one_line(result)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("ssh://root@[::1", ["'['", "']'"]),
        ("ssh://root@[not-an-ip]:22", ["'not-an-ip'", "IPv6"]),
        ("ssh://" + "a" * 300 + ".example", ["label of 300 characters", "at most 63"]),
        ("ssh://" + ".".join(["abcdefgh"] * 40), ["359 characters", "at most 253"]),
        ("ssh://box:0", ["port 0", "1-65535"]),
        ("ssh://box:", ["empty port"]),
        ("ssh://box:２２", ["port '２２'", "digits"]),
        ("ssh://@box", ["empty user"]),
        ("ssh://ro ot@box", ["user 'ro ot'"]),
        ("ssh://-oProxyCommand=x@box", ["user '-oProxyCommand=x'"]),
        ("ssh://bo_x..y", ["'bo_x..y'"]),
        ("ssh://box?x=1", ["'box?x=1'"]),
        ("ssh://a@b@box", ["'a@b@box'"]),
    ],
)
def test_url_edge_cases_are_refused_naming_the_part(bad: str, words: list[str]) -> None:
    """Each --host edge case from the review is one usage error naming the bad part, never a default."""
    with pytest.raises(UsageError) as info:
        parse_url(bad)
    message = str(info.value)
    assert message.startswith("--host ") and all(w in message for w in words), message
    assert len(message) < 400, message  # a huge value is quoted cut short


def test_ipv6_and_dns_names_parse() -> None:
    """A bracketed IPv6 address and a dotted DNS name with a port parse to address and port."""
    assert (parse_url("ssh://ops@[::1]:2200").address, parse_url("ssh://ops@[::1]:2200").port) == ("::1", 2200)
    assert parse_url("ssh://gpu-1.lab.example.com").address == "gpu-1.lab.example.com"


def test_a_bad_orchestrator_host_names_the_variable(tmp_path: Path) -> None:
    """A bad URL in $ORCHESTRATOR_HOST: exit 2, one line naming the variable rather than --host."""
    result = cli(tmp_path, "history", env={"ORCHESTRATOR_HOST": "ssh://root@[::1"})
    assert result.returncode == 2 and one_line(result).startswith("error: ORCHESTRATOR_HOST 'ssh://root@[::1'")


def test_a_bad_host_url_exits_2_on_one_line(tmp_path: Path) -> None:
    """--host with an unclosed IPv6 bracket: exit 2 and one line, not a traceback."""
    result = cli(tmp_path, "--host", "ssh://root@[::1", "status")
    assert result.returncode == 2 and "--host 'ssh://root@[::1'" in one_line(result)


def _agent_that_dies_after_one_event(path: str) -> None:
    """A socket that answers like an agent killed mid-switch: one progress line, then EOF."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        conn.sendall(b'{"event": "phase", "fields": {"phase": "stopping", "revision": 2, "model": "beta"}}\n')
        conn.close()
        server.close()

    threading.Thread(target=serve, daemon=True).start()


def test_agent_dying_mid_switch_says_it_resumes_and_how_to_follow(tmp_path: Path) -> None:
    """The stream ends without an answer: the error says the agent resumes the switch and names
    `status --follow` (the same text as through the relay, which then exits 0 with nothing on stderr)."""
    from orchestrator.client.backends import AgentClient
    from orchestrator.contract.ops import SWITCH
    from orchestrator.errors import AgentError

    path = str(tmp_path / "agent.sock")
    _agent_that_dies_after_one_event(path)
    with pytest.raises(AgentError) as err:
        AgentClient(path).call(SWITCH, {"model": "beta"})
    assert "closed the connection before answering switch" in str(err.value)
    assert "resumes the switch when it starts again" in str(err.value)
    assert "`orchestrator status --follow`" in str(err.value)
