"""Values the offline checks accepted (exit 0) where exit 2 is due: each is refused at load, naming the
key and the bad value; `tune --layouts` a model's shapes refuse exits 2 before any host is reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.client.targets import load_hosts
from orchestrator.errors import ConfigError
from tests.unit.test_probe_config import refused, write

from .cli_runner import invoke

GROUP = '[hosts.b1]\ngpus = 8\n[hosts.b2]\ngpus = 8\n[groups.fleet]\nhosts = ["b1", "b2"]\n'


@pytest.mark.parametrize(
    "where,line,key,value",
    [
        ("top", "metrics_port = 8000\n[proxy]\nenabled = true\nport = 8000", "metrics_port", "8000"),
        ("host", 'interface = "eth0; id"', "hosts.box.interface", "'eth0; id'"),
        ("host", 'interface = "$(id)"', "hosts.box.interface", "'$(id)'"),
        ("host", 'interface = "eth0 eth1"', "hosts.box.interface", "'eth0 eth1'"),
        ("model", 'allow_patterns = ["../../etc/*"]', "models.a.allow_patterns[0]", "'../../etc/*'"),
        ("model", 'ignore_patterns = ["/etc/*"]', "models.a.ignore_patterns[0]", "'/etc/*'"),
        ("model", 'args = ["--enable-sleep"]', "models.a.args[0]", "'--enable-sleep'"),
        ("model", 'args = ["--no-enable-sleep=true"]', "models.a.args[0]", "'--no-enable-sleep=true'"),
        ("rest", GROUP + "max_failures = 3", "groups.fleet.max_failures", "max_failures 3"),
    ],
)
def test_a_value_the_offline_check_let_through_is_refused(
    tmp_path: Path, where: str, line: str, key: str, value: str
) -> None:
    """Exit 2 naming the key and the value."""
    message = refused(write(tmp_path, **{where: line}))
    assert f"{key}: " in message and value in message


def test_proxy_accounts_that_do_not_exist_here_are_refused(tmp_path: Path) -> None:
    """[proxy] user naming no account of this box (a local host runs the proxy): exit 2 naming it."""
    cfg = write(
        tmp_path, host='transport = "local"', rest='[proxy]\nenabled = true\nport = 9000\nuser = "no-such-account"'
    )
    assert "proxy.user: 'no-such-account': no such user on this machine" in refused(cfg)


def test_a_proxy_group_that_does_not_exist_here_is_refused(tmp_path: Path) -> None:
    """[proxy] group naming no group of this box: exit 2 naming it."""
    cfg = write(
        tmp_path,
        host='transport = "local"',
        rest='[proxy]\nenabled = true\nport = 9000\nuser = "nobody"\ngroup = "no-such-group"',
    )
    assert "proxy.group: 'no-such-group': no such group on this machine" in refused(cfg)


def test_a_proxy_user_without_a_group_of_its_name_needs_proxy_group(tmp_path: Path) -> None:
    """[proxy] user = "nobody" alone: HAProxy's group would be "nobody", which Debian does not have: exit 2."""
    cfg = write(tmp_path, host='transport = "local"', rest='[proxy]\nenabled = true\nport = 9000\nuser = "nobody"')
    assert "proxy.user: 'nobody': no such group on this machine (HAProxy's group: [proxy] group unset" in refused(cfg)


@pytest.mark.parametrize(
    "key,value",
    [
        ("python", "sh"),
        ("python", "/opt/o/bin/python; id"),
        ("socket", "/run/$(id).sock"),
        ("socket", "/run/a b.sock"),
        ("socket", "/run/../etc/a.sock"),
    ],
)
def test_a_hosts_file_python_or_socket_that_is_no_plain_path_is_refused(tmp_path: Path, key: str, value: str) -> None:
    """hosts.toml's python and socket reach the relay's command on the box: a plain absolute path or exit 2."""
    path = tmp_path / "hosts.toml"
    path.write_text(f'[gpu1]\nurl = "ssh://root@10.0.0.5"\n{key} = "{value}"\n')
    with pytest.raises(ConfigError) as info:
        load_hosts(path)
    assert info.value.exit_code == 2 and f"gpu1.{key}: " in str(info.value) and repr(value) in str(info.value)


def test_tune_refuses_a_layout_the_shipped_config_refuses_before_reaching_the_host(tmp_path: Path) -> None:
    """`tune --layouts tp3` of a model whose config.json has 8 KV heads: exit 2 naming the rule, not 4."""
    cfg = write(
        tmp_path, host='address = "127.0.0.9"\nssh_port = 1', model='config = "shipped:MiniMaxAI__MiniMax-M2.5.json"'
    )
    result = invoke("tune", "a", "--layouts", "tp3", "--config", str(cfg), "--yes")
    assert result.exit_code == 2, result.stderr
    assert "layout tp3 cannot load: num_key_value_heads 8 is not divisible by TP 3" in result.stderr
