"""Choose the adapters for each host once, at start-up, and build the operations on them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.adapters import connect
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.adapters.smoke import SmokeBench
from orchestrator.adapters.weights import SpecWeights
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.records import Deployment
from orchestrator.deploy.operations import Operations
from orchestrator.ports import HostPorts


def build_ports(catalog: Catalog, host: Host) -> HostPorts:
    shell, systemd = connect(host.transport, host.address, port=host.ssh_port, user=host.ssh_user,
                             key_filename=host.ssh_key, known_hosts=host.known_hosts, unit_dir=host.unit_dir,
                             host=host.name)
    token_file = f"{catalog.defaults.env_dir.rstrip('/')}/hf-token"
    weights = SpecWeights(HfWeightStore(shell, python=host.python), host, token_file, fleet=catalog.hosts,
                          keep_revisions=catalog.policy.keep_revisions)
    return HostPorts(host=host, shell=shell, systemd=systemd, gpus=NvidiaSmiProbe(shell),
                     health=HttpHealthProbe(), clock=SystemClock(), weights=weights,
                     smoke=SmokeBench() if catalog.policy.smoke_bench else None)


def ports_factory(catalog: Catalog) -> Callable[[str], HostPorts]:
    """One set of adapters (one SSH connection) per host, made on first use and then reused."""
    cache: dict[str, HostPorts] = {}

    def ports_for(name: str) -> HostPorts:
        if name not in cache:
            cache[name] = build_ports(catalog, catalog.hosts[name])
        return cache[name]

    return ports_for


def pause_hook(directory: str) -> Callable[[Deployment], None]:
    """Test hook: hold the engine before the phase named in <dir>/pause-at until that file goes away."""
    pause_at, paused = Path(directory) / "pause-at", Path(directory) / "paused"

    def hook(dep: Deployment) -> None:
        try:
            wanted = pause_at.read_text().strip()
        except FileNotFoundError:
            return
        if wanted != dep.phase.value:
            return
        paused.write_text(f"{dep.id} {dep.phase.value}\n")
        while pause_at.exists():
            time.sleep(0.05)

    return hook


def operations(catalog: Catalog, *, test_hooks: bool = False) -> Operations:
    hook_dir = os.environ.get("ORCHESTRATOR_TEST_PAUSE_DIR") if test_hooks else None
    template_path = os.environ.get("ORCHESTRATOR_TEMPLATE")
    return Operations(catalog, ports_factory(catalog),
                      template=Path(template_path).read_text() if template_path else None,
                      before_step=pause_hook(hook_dir) if hook_dir else None)
