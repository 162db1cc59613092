"""What the agent loads, on a real test host: a schedule whose cron only fired in the past is refused
with exit 2 by `config push` over `--host` (the box's file unchanged, the agent serving on) and by the
agent at start (the unit stays failed with the one-line reason, not a restart loop of tracebacks)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import CONFIG, STATE, active, install_agent
from tests.test_switch_hosts import MODELS, config_text

PY = sys.executable
UNIT = "/etc/systemd/system/orchestrator-agent.service"
PAST = '[schedules.old]\ncron = "0 0 1 1 * 0 2001"\naction = "redeploy"\n'

pytestmark = pytest.mark.hosts


@pytest.fixture
def box(hosts: list[Host], tmp_path: Path) -> Iterator[tuple[Host, str]]:
    host = hosts[0]
    install_agent(host, config_text(host, Path(STATE), MODELS, transport="local"), tmp_path)
    (tmp_path / "hosts.toml").write_text(
        f'[box]\nurl = "ssh://root@{host.address}:{host.port}"\nkey = "{host.key_path}"\n'
        f'known_hosts = "{host.known_hosts_path}"\npython = "{PY}"\nsocket = "{STATE}/agent.sock"\n'
    )
    try:
        yield host, str(tmp_path / "hosts.toml")
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service; systemctl reset-failed orchestrator-agent.service", check=False
        )


def client(hosts_file: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "orchestrator", "--host", "box", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "ORCHESTRATOR_HOSTS_FILE": hosts_file},
    )


def test_config_push_of_a_past_only_cron_is_refused_and_changes_nothing(box: tuple[Host, str], tmp_path: Path) -> None:
    """Exit 2 naming the pushed file, the schedule and its cron; the box's file, .prev and agent unchanged."""
    host, hosts_file = box
    before = host.run(["cat", CONFIG]).stdout
    pid = host.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout
    pushed = tmp_path / "next.toml"
    pushed.write_text(before + PAST)
    result = client(hosts_file, "config", "push", str(pushed))
    assert result.returncode == 2, result.stderr
    assert "next.toml" in result.stderr and "schedules.old.cron" in result.stderr and "2001" in result.stderr
    assert "Traceback" not in result.stderr
    assert host.run(["cat", CONFIG]).stdout == before
    assert host.run(["test", "-e", f"{CONFIG}.prev"], check=False).returncode != 0
    assert host.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout == pid
    assert client(hosts_file, "schedules", "--json").returncode == 0


def test_agent_start_with_a_past_only_cron_fails_once_with_the_reason(box: tuple[Host, str]) -> None:
    """The agent exits 2 naming schedules.old.cron; RestartPreventExitStatus=2 keeps it failed, not looping."""
    host, _ = box
    host.write_file(CONFIG, host.run(["cat", CONFIG]).stdout + PAST)
    # The product's own entry point (the harness's hooked one would not say how the product exits).
    host.run(
        f"sed -i -E 's|-m tests.agent_with_hooks --config (\\S+) --pause-dir \\S+|-m orchestrator agent "
        f"--config \\1|' {UNIT} && grep -q -- '-m orchestrator agent --config' {UNIT} && systemctl daemon-reload"
    )
    host.run("systemctl restart orchestrator-agent.service", check=False)
    wait_for(
        lambda: active(host, "orchestrator-agent.service"),
        lambda s: s == "failed",
        timeout=60,
        what="the agent to fail on its config",
    )
    status = host.run(["systemctl", "show", "-p", "ExecMainStatus", "--value", "orchestrator-agent"]).stdout
    assert status.strip() == "2"
    journal = host.run("journalctl -u orchestrator-agent.service --no-pager -o cat -n 30").stdout
    assert "schedules.old.cron" in journal and "Traceback" not in journal
