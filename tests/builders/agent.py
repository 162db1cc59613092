"""Where the agent host tests (and bench/fleet/fleet_rollout.py, bench/on_demand.py) put a box's agent:
config, state, hooks; installing it and running the CLI on the box."""

from __future__ import annotations

import json
import re
import shlex
import socket
import sys
from pathlib import Path
from typing import Any

import httpx

from orchestrator import settings
from orchestrator.core.render import exec_quote, render_agent_unit
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
CONFIG = "/etc/orchestrator-agent-test.toml"
STATE = "/var/lib/orchestrator-agent-test"
HOOKS = "/run/orchestrator-hooks"
PY = sys.executable


def cli(host: Host, *args: str, check: bool = True, user: str | None = None) -> Any:
    line = shlex.join([PY, "-m", "orchestrator", *args, "--config", CONFIG])
    if user:
        line = f"runuser -u {user} -- {line}"
    return host.run(line, check=check)


def history(host: Host) -> list[dict[str, Any]]:
    return list(json.loads(cli(host, "history", "--json").stdout))


def active(host: Host, unit: str) -> str:
    return str(host.run(["systemctl", "is-active", unit], check=False).stdout.strip())


def main_pid(host: Host) -> str:
    return str(host.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip())


def sigkill_agent(host: Host, unpause: str = "pause-at pause-on paused") -> None:
    """SIGKILL the agent (first removing the hook files ``unpause`` names, so the next one runs on);
    returns once systemd started a new one and it is active (Type=notify: ready)."""
    old_pid = main_pid(host)
    files = " ".join(f"{HOOKS}/{f}" for f in unpause.split())
    host.run(f"rm -f {files} && systemctl kill -s SIGKILL orchestrator-agent.service")
    wait_for(
        lambda: main_pid(host) not in ("0", old_pid) and active(host, "orchestrator-agent.service") == "active",
        what="systemd to restart the agent",
        timeout=60,
    )


def engine_sleeping(host: Host, port: int) -> bool | None:
    """The engine on ``port`` of ``host``, in its own word (GET /is_sleeping); None when it does not
    answer (stopped)."""
    try:
        r = httpx.get(f"http://{host.address}:{port}/is_sleeping", timeout=5)
    except httpx.HTTPError:
        return None
    return bool(r.json()["is_sleeping"])


METRICS: dict[str, str] = {}  # host name -> its agent's metrics URL


def free_port() -> int:
    with socket.socket() as s:  # test hosts share this machine's loopback: a port free here is free there
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_agent(host: Host, config: str, tmp: Path, *, hook_args: str = "") -> None:
    """The product's agent unit, started through the test-only entry point that adds the pause hook
    (``hook_args``: more of that entry point's options, e.g. ``--minute-ends-in 12``)."""
    port = free_port()  # runs beside this one (other checkouts) have agents of their own
    METRICS[host.name] = f"http://127.0.0.1:{port}/metrics"
    config = config.replace("metrics_port = 19464", f"metrics_port = {port}")
    host.write_file(CONFIG, config)
    # A fresh state dir: an earlier test's records (same host, same session) must not answer this one's waits;
    # and a fresh box has no previous config (an earlier test's `config push` left its CONFIG.prev).
    host.run(f"groupadd -f orchestrator && rm -rf {STATE} {CONFIG}.prev && mkdir -p {HOOKS} && rm -f {HOOKS}/*")
    cfg_path = tmp / "agent.toml"
    cfg_path.write_text(config)
    unit = render_agent_unit(
        settings.load(cfg_path),
        (REPO / "templates/orchestrator-agent.service.j2").read_text(),
        python=PY,
        config=CONFIG,
        extra_env={"PYTHONPATH": str(REPO)},
    )
    # The interpreter quoted as the product quotes it: the checkout may live in a directory with spaces
    # (only it: test_agent_config_hosts' sed finds the rest of the line as written).
    hooked = (
        f"ExecStart={exec_quote(PY)} -m tests.agent_with_hooks --config {CONFIG} --pause-dir {HOOKS} {hook_args}"
    ).rstrip()
    text = re.sub(r"^ExecStart=.*$", lambda _: f"WorkingDirectory={REPO}\n{hooked}", unit.text, flags=re.MULTILINE)
    # The crash tests await systemd's restart of a SIGKILLed agent: the product's 2 s pause before it
    # only slows them (what they check is that systemd restarts it and the switch converges).
    text = re.sub(r"^RestartSec=.*$", "RestartSec=100ms", text, count=1, flags=re.MULTILINE)
    host.write_file("/etc/systemd/system/orchestrator-agent.service", text)
    host.run("systemctl daemon-reload && systemctl start orchestrator-agent.service")
