"""Choose the adapters for each host once, at start-up, and build the operations on them."""

from __future__ import annotations

import sys
from collections.abc import Callable

from orchestrator.adapters import connect
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.engine_http import HttpEngineControl
from orchestrator.adapters.gpu_choice import ChosenGpuProbe
from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.smoke import SmokeBench
from orchestrator.adapters.weights import SpecWeights
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.catalog_hosts import INSTALLED_PYTHON
from orchestrator.core.proxy import render_unit
from orchestrator.deploy.operations import Operations
from orchestrator.engines import ENGINES
from orchestrator.ports import FrontProxy, HostPorts
from orchestrator.resources import template_text


def host_python(host: Host, own: str = sys.executable) -> str:
    """The interpreter that runs the product's workers on the host: ``python`` when set, else this
    process's own on a local host (the agent's venv), else the installed venv over SSH."""
    if host.python:
        return host.python
    return own if host.transport == "local" and own else INSTALLED_PYTHON


def build_ports(catalog: Catalog, host: Host) -> HostPorts:
    shell, systemd = connect(
        host.transport,
        host.address,
        port=host.ssh_port,
        user=host.ssh_user,
        key_filename=host.ssh_key,
        known_hosts=host.known_hosts,
        unit_dir=host.unit_dir,
        host=host.name,
    )
    token_file = f"{catalog.defaults.env_dir.rstrip('/')}/hf-token"
    python = host_python(host)
    weights = SpecWeights(
        HfWeightStore(shell, python=python),
        host,
        token_file,
        fleet=catalog.hosts,
        keep_revisions=catalog.policy.keep_revisions,
    )
    proxy: FrontProxy | None = None
    if catalog.proxy.enabled:
        bind = catalog.proxy.bind or host.bind or catalog.defaults.bind
        proxy = HaproxyProxy(
            shell,
            systemd,
            catalog.proxy,
            bind,
            render_unit(catalog.proxy, bind, template_text("orchestrator-proxy.service.j2")),
            python=python,
            host=host.name,
            local=host.transport == "local",
        )
    # NVML in this process on the agent's own box, nvidia-smi over the shell elsewhere (adapters.gpu_choice)
    gpus = ChosenGpuProbe(shell, mode=host.gpu_probe, local=host.transport == "local")
    return HostPorts(
        host=host,
        shell=shell,
        systemd=systemd,
        gpus=gpus,
        health=HttpHealthProbe(),
        clock=SystemClock(),
        weights=weights,
        smoke=SmokeBench() if catalog.policy.smoke_bench else None,
        proxy=proxy,
        engine_controls={name: HttpEngineControl(engine) for name, engine in ENGINES.items()},
    )


def ports_factory(catalog: Catalog) -> Callable[[str], HostPorts]:
    """One set of adapters (one SSH connection) per host, made on first use and then reused."""
    cache: dict[str, HostPorts] = {}

    def ports_for(name: str) -> HostPorts:
        if name not in cache:
            cache[name] = build_ports(catalog, catalog.hosts[name])
        return cache[name]

    return ports_for


def operations(catalog: Catalog, *, reading: bool = False) -> Operations:
    """``reading``: for a read-only command, whose stores open read-only (nothing made on disk)."""
    return Operations(catalog, ports_factory(catalog), reading=reading)
