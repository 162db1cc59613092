"""A box's own agent for the fleet rollout tests and bench/fleet/fleet_rollout.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.core.render import render_agent_unit
from tests.builders.agent import CONFIG, HOOKS, PY, REPO, STATE
from tests.builders.switch import config_text
from tests.hosts.machine import Host

SOCKET = f"{STATE}/agent.sock"


def install(host: Host, models: dict[str, dict[str, Any]], env: dict[str, str] | None = None) -> None:
    """The box's own agent (its deploy.toml names only itself), serving alpha to start with."""
    config = config_text(host, Path(STATE), models, transport="local")
    host.run(f"systemctl stop orchestrator-agent.service; rm -rf {STATE} /models", check=False)
    host.write_file(CONFIG, config)
    host.run(f"groupadd -f orchestrator && mkdir -p {HOOKS} && rm -f {HOOKS}/*")
    with tempfile.TemporaryDirectory() as work:  # settings load from a file; no copy left behind in /tmp
        local = Path(work) / "deploy.toml"
        local.write_text(config)
        loaded = settings.load(local)
    unit = render_agent_unit(
        loaded,
        (REPO / "templates/orchestrator-agent.service.j2").read_text(),
        python=PY,
        config=CONFIG,
        extra_env=env or {},
    )
    host.write_file("/etc/systemd/system/orchestrator-agent.service", unit.text)
    host.run("systemctl daemon-reload && systemctl start orchestrator-agent.service")


def one_host_env(work: Path, host: Host) -> tuple[str, dict[str, str]]:
    """``host`` by its ssh:// URL for a CLI's `--host URL`: (the URL, the environment naming a hosts file in
    ``work`` that gives it its key, known_hosts, python and the agent's socket)."""
    url = f"ssh://root@{host.address}:{host.port}"
    hosts_file = work / "hosts.toml"
    hosts_file.write_text(
        f'["{url}"]\nurl = "{url}"\nkey = "{host.key_path}"\n'
        f'known_hosts = "{host.known_hosts_path}"\npython = "{PY}"\nsocket = "{SOCKET}"\n'
    )
    return url, {"ORCHESTRATOR_HOSTS_FILE": str(hosts_file)}
