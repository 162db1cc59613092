"""`agent install` on a controller: a group host without the controller's ssh_key is refused before
anything is sent (bootstrap/controller_keys.group_hosts)."""

from __future__ import annotations

from pathlib import Path

from .cli_runner import invoke

CONFIG = (
    'state_dir = "{state}"\n[hosts.n1]\naddress = "127.0.0.1"\nssh_key = "/etc/orchestrator/ctl"\n'
    '[hosts.n2]\naddress = "127.0.0.2"\n[groups.inference]\nhosts = ["n1", "n2"]\n'
)


def test_a_group_host_without_ssh_key_exits_2_naming_it_before_connecting(tmp_path: Path) -> None:
    """n2 has no ssh_key: exit 2 naming n2, its group and the fix; the box (nothing listens) is never tried."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(CONFIG.format(state=tmp_path / "state"))
    result = invoke("agent", "install", "ssh://root@127.0.0.1:2", "--config", str(cfg))
    assert result.exit_code == 2, result.output
    assert "host n2 of group inference has no ssh_key" in result.output
    assert 'set ssh_key = "/etc/orchestrator/controller_ed25519"' in result.output
