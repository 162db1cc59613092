"""`orchestrator agent install` on a bare test host in its own network namespace, then used through --host.

The box gets the agent from this tree (a wheel built here, dependency wheels shipped, installed
offline into /opt/orchestrator); the CLI on this machine then switches through the relay.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import keys
from tests.hosts.machine import Host
from tests.hosts.pool import boot_hosts
from tests.hosts.wait import wait_for
from tests.test_switch_hosts import MODELS, config_text
from tests.test_weights_hosts import LOCAL, add_manifest, write_model

PY = sys.executable
REPO = Path(__file__).resolve().parents[1]
STATE = Path("/var/lib/orchestrator")
UNIT = "orchestrator-agent.service"
BOX_MODELS = {
    "alpha": MODELS["alpha"],
    "beta": MODELS["beta"],
    "slow": {"port": 8110, "args": ["--load-time", "30"], "load_deadline_s": 90},
    "tiny": LOCAL,
}

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def box() -> Iterator[Host]:
    """A bare box: the host boots from an overlay of this machine's root, so whatever orchestrator
    left here (a state dir from a demo run, say) is removed inside it first."""
    with boot_hosts(1, netns=True) as hostset:
        host = hostset.hosts[0]
        host.run("rm -rf /var/lib/orchestrator /etc/orchestrator /opt/orchestrator")
        yield host


def install(
    box: Host, *args: str, known_hosts: Path | None = None, port: int | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    url = f"ssh://root@{box.address}:{port or box.port}"
    argv = [
        PY,
        "-m",
        "orchestrator",
        "agent",
        "install",
        url,
        "--key",
        str(box.key_path),
        "--known-hosts",
        str(known_hosts or box.known_hosts_path),
        *args,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **(env or {})}
    )


def client_env(box: Host, tmp: Path) -> dict[str, str]:
    """A hosts file naming the box `box`, python and socket left to their defaults (the installed ones)."""
    hosts = tmp / "hosts.toml"
    hosts.write_text(
        f'[box]\nurl = "ssh://root@{box.address}:{box.port}"\nkey = "{box.key_path}"\n'
        f'known_hosts = "{box.known_hosts_path}"\n'
    )
    return {**os.environ, "ORCHESTRATOR_HOSTS_FILE": str(hosts)}


def client(box: Host, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on this machine through the box's agent."""
    return subprocess.run(
        [PY, "-m", "orchestrator", "--host", "box", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=client_env(box, tmp),
    )


def untouched(box: Host) -> bool:
    return (
        box.run(
            f"test -e /opt/orchestrator || test -e /etc/orchestrator || test -e /etc/systemd/system/{UNIT}", check=False
        ).returncode
        != 0
    )


def main_pid(box: Host) -> str:
    return box.run(["systemctl", "show", "-p", "MainPID", "--value", UNIT]).stdout.strip()


def current_venv(box: Host) -> str:
    return box.run(["readlink", "/opt/orchestrator/venv"]).stdout.strip()


def modified_tree(tmp: Path, marker: str) -> Path:
    """A copy of this tree whose package differs by one comment: another wheel fingerprint."""
    tree = tmp / f"src-{marker}"
    for part in ("pyproject.toml", "README.md"):
        tree.mkdir(exist_ok=True)
        shutil.copy2(REPO / part, tree / part)
    for part in ("orchestrator", "templates"):
        shutil.copytree(REPO / part, tree / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    with (tree / "orchestrator" / "__init__.py").open("a") as fh:
        fh.write(f"# build {marker}\n")
    return tree


def steps(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    return {s["step"]: s for s in report["steps"]} | {"_report": report}


@pytest.fixture(scope="module")
def installed(box: Host, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The first install on the bare box, with a deploy.toml for the stand-in engine that leaves the
    host's `python` unset, as the README's does."""
    cfg = tmp_path_factory.mktemp("cfg") / "deploy.toml"
    text = config_text(box, STATE, BOX_MODELS, transport="local")
    cfg.write_text("".join(line for line in text.splitlines(keepends=True) if not line.startswith("python = ")))
    return steps(install(box, "--config", str(cfg), "--json"))


def test_unreachable_box_exits_4_and_changes_nothing(box: Host) -> None:
    """Nothing listens on the port: exit 4, one line naming the box, nothing written there."""
    result = install(box, port=2)
    assert result.returncode == 4, result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"error: host ssh://root@{box.address}:2: SSH connection to {box.address}:2 refused"
    )
    assert untouched(box)


def test_wrong_host_key_exits_4_and_changes_nothing(box: Host, tmp_path: Path) -> None:
    """known_hosts holds another key for the box: exit 4 naming the mismatch; nothing written there."""
    other = keys.generate_ed25519(tmp_path / "other_host_key", "not-the-box")
    forged = tmp_path / "known_hosts"
    forged.write_text(keys.known_hosts_line(box.address, box.port, other))
    result = install(box, known_hosts=forged)
    assert result.returncode == 4, result.stderr
    assert "host key mismatch" in result.stderr and box.address in result.stderr
    assert untouched(box)


def test_bad_config_exits_2_before_connecting(box: Host, tmp_path: Path) -> None:
    """A misspelt key in --config: exit 2 naming the file and the key; nothing written on the box."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        config_text(box, STATE, BOX_MODELS, transport="local")
        + '[models.delta]\nrepo = "test/delta"\ngpus = [0]\ntensor_paralel = 4\n'
    )
    result = install(box, "--config", str(cfg))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert str(cfg) in line and "tensor_paralel" in line and len(line.splitlines()) == 1
    assert untouched(box)


def test_install_on_a_bare_box_then_a_switch_through_host(box: Host, installed: dict[str, Any], tmp_path: Path) -> None:
    """Every step acts on the bare box; the agent runs from its own venv and a --host switch goes through it."""
    report = installed["_report"]
    assert report["changed"] and all(installed[s]["changed"] for s in ("package", "config", "unit", "service"))
    assert box.run(["systemctl", "is-active", UNIT]).stdout.strip() == "active"
    assert box.run(["systemctl", "is-enabled", UNIT]).stdout.strip() == "enabled"
    assert current_venv(box) == f"venvs/{report['fingerprint']}"
    exec_start = box.run(["systemctl", "show", "-p", "ExecStart", "--value", UNIT]).stdout
    assert f"/opt/orchestrator/venvs/{report['fingerprint']}/bin/python" in exec_start
    assert box.run(["getent", "group", "orchestrator"], check=False).returncode == 0
    done = client(box, tmp_path, "switch", "alpha", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "active"
    assert box.run(["systemctl", "is-active", "vllm-alpha.service"]).stdout.strip() == "active"


def test_a_model_with_weights_switches_on_the_fresh_box(box: Host, installed: dict[str, Any], tmp_path: Path) -> None:
    """A `local:` model stages through the worker in the agent's own venv (/usr/bin/python3 lacks it)."""
    add_manifest(write_model(box))
    done = client(box, tmp_path, "switch", "tiny", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["outcome"] == "active"
    assert box.run(["systemctl", "is-active", "vllm-tiny.service"]).stdout.strip() == "active"


def test_second_install_changes_nothing(box: Host, installed: dict[str, Any]) -> None:
    """Run again with the same tree: every step reports unchanged and the agent keeps its pid."""
    pid = main_pid(box)
    again = steps(install(box, "--json"))
    assert not again["_report"]["changed"], again
    assert again["_report"]["fingerprint"] == installed["_report"]["fingerprint"]
    assert main_pid(box) == pid
    plain = install(box)
    assert plain.returncode == 0 and "nothing to do" in plain.stdout, plain.stderr


def test_upgrade_while_a_switch_runs_exits_5_naming_it(box: Host, installed: dict[str, Any], tmp_path: Path) -> None:
    """--upgrade with a switch running: exit 5 naming it; the agent, its venv and the switch go on."""
    before, pid = current_venv(box), main_pid(box)
    running = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "slow"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=client_env(box, tmp_path),
    )
    try:
        wait_for(
            lambda: json.loads(client(box, tmp_path, "status", "--json").stdout)["agent"]["running"],
            bool,
            timeout=60,
            what="the switch to run on the box",
        )
        refused = install(box, "--upgrade", "--source", str(modified_tree(tmp_path, "busy")))
    finally:
        _out, err = running.communicate(timeout=180)
    assert refused.returncode == 5, refused.stderr
    assert "slow (revision" in refused.stderr and "between operations" in refused.stderr
    assert (current_venv(box), main_pid(box)) == (before, pid)
    assert running.returncode == 0, err


def test_upgrade_replaces_the_package_and_restarts_the_agent(
    box: Host, installed: dict[str, Any], tmp_path: Path
) -> None:
    """--upgrade from a changed tree: a new venv, the agent restarted on it, history kept, switches work."""
    pid = main_pid(box)
    upgraded = steps(install(box, "--upgrade", "--source", str(modified_tree(tmp_path, "next")), "--json"))
    new = upgraded["_report"]["fingerprint"]
    assert new != installed["_report"]["fingerprint"] and upgraded["package"]["changed"]
    assert "restarted" in upgraded["service"]["detail"] and main_pid(box) != pid
    assert current_venv(box) == f"venvs/{new}"
    assert not upgraded["config"]["changed"]
    done = client(box, tmp_path, "switch", "beta", "--json")
    assert done.returncode == 0, done.stderr
    history = json.loads(client(box, tmp_path, "history", "--json").stdout)
    assert [h["model"] for h in history][-1] == "alpha" and history[0]["model"] == "beta"
