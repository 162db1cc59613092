"""A team member who is not root, in the socket group, works the box over `--host ssh://bob@...`:
status, switch and history keep working across agent restarts, and the audit names bob."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import keys
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import STATE, active, install_agent
from tests.test_switch_hosts import MODELS, config_text

PY = sys.executable
AUTHORIZED = "/etc/ssh/testhost_authorized_keys"  # the test hosts' sshd reads every user's keys here

pytestmark = pytest.mark.hosts


@pytest.fixture
def bob(hosts: list[Host], tmp_path: Path) -> Iterator[tuple[Host, str]]:
    """h1 runs the agent; bob (not root, in the socket group "orchestrator") has a key of his own."""
    box = hosts[0]
    install_agent(box, config_text(box, Path(STATE), MODELS, transport="local"), tmp_path)
    public = keys.generate_ed25519(tmp_path / "bob_key", "bob@client")
    # useradd leaves the password locked ("!"), which sshd without PAM refuses even for a key: "*" is not.
    # (chmod 0711 /root: the interpreter of these tests lives under /root/.pyenv)
    box.run(
        "id bob >/dev/null 2>&1 || useradd -m -s /bin/sh -G orchestrator bob; usermod -p '*' bob; "
        f"cp {AUTHORIZED} {AUTHORIZED}.orig; chmod 0711 /root"
    )
    box.run(f"cat >> {AUTHORIZED}", input=public + "\n")
    url = f"ssh://bob@{box.address}:{box.port}"
    (tmp_path / "hosts.toml").write_text(
        f'[box]\nurl = "{url}"\nkey = "{tmp_path / "bob_key"}"\nknown_hosts = "{box.known_hosts_path}"\n'
        f'python = "{PY}"\nsocket = "{STATE}/agent.sock"\n'
    )
    try:
        yield box, url
    finally:
        box.run(
            f"mv {AUTHORIZED}.orig {AUTHORIZED}; chmod 0700 /root; systemctl stop orchestrator-agent.service",
            check=False,
        )


def as_bob(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "orchestrator", "--host", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PATH": "/usr/bin:/bin", "ORCHESTRATOR_HOSTS_FILE": str(tmp_path / "hosts.toml")},
    )


def ok(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def restart_agent(box: Host) -> None:
    box.run("systemctl restart orchestrator-agent.service")
    wait_for(
        lambda: active(box, "orchestrator-agent.service"),
        lambda s: s == "active",
        timeout=60,
        what="the agent to be active again",
    )


def state_dir_mode(box: Host) -> str:
    return str(box.run(["stat", "-c", "%a %G", STATE]).stdout.strip())


def test_a_non_root_operator_keeps_working_across_agent_restarts(bob: tuple[Host, str], tmp_path: Path) -> None:
    """bob (socket group, own key): status, switch, history through ssh://bob@ before and after restarts."""
    box, url = bob
    assert box.run("id -u bob").stdout.strip() != "0"
    assert ok(as_bob(tmp_path, url, "status", "--json"))["agent"]["pid"] > 0
    first = ok(as_bob(tmp_path, url, "switch", "alpha", "--json"))
    assert first["outcome"] == "active" and first["trigger"].startswith("bob@")
    restart_agent(box)
    assert state_dir_mode(box) == "750 orchestrator"
    assert ok(as_bob(tmp_path, url, "status", "--json"))["hosts"][box.name]["serving"]["model"] == "alpha"
    second = ok(as_bob(tmp_path, url, "switch", "beta", "--json"))
    assert second["outcome"] == "active" and second["trigger"].startswith("bob@")
    restart_agent(box)
    rows = ok(as_bob(tmp_path, url, "history", "--json"))
    assert [(r["model"], r["outcome"]) for r in rows] == [("beta", "active"), ("alpha", "active")]
    assert all(r["trigger"].startswith("bob@") for r in rows)
    assert state_dir_mode(box) == "750 orchestrator"
    assert active(box, "vllm-beta.service") == "active"
