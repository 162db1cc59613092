"""Choose the adapters for each host once, at start-up, and build the operations on them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.adapters import connect
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.adapters.smoke import SmokeBench
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.proxy import render_unit
from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.weights import StageRequest
from orchestrator.deploy.operations import Operations
from orchestrator.errors import WeightsError
from orchestrator.ports import FrontProxy, HostPorts, ProgressCallback, StagedWeights
from orchestrator.resources import template_text


class SpecWeights:
    """The engine's WeightStore port over the Hugging Face store: a UnitSpec in, verified weights out."""

    def __init__(self, store: HfWeightStore, host: Host, token_file: str | None) -> None:
        self.store = store
        self.host = host
        self.token_file = token_file

    def _request(self, spec: UnitSpec) -> StageRequest:
        return StageRequest(name=spec.repo.replace("/", "--"), repo=spec.repo, revision=spec.revision,
                            root=self.host.models_dir, source=spec.source, token_file=self.token_file,
                            endpoint=os.environ.get("HF_ENDPOINT"))

    def stage(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        if spec.source.startswith("local:"):
            return self._in_place(spec)
        manifest = self.store.stage(self._request(spec), progress)
        return StagedWeights(path=manifest.path, revision=manifest.revision, total_bytes=manifest.total_bytes)

    def _in_place(self, spec: UnitSpec) -> StagedWeights:
        """Weights the operator keeps in a directory of the host: used where they are, once checked."""
        path = spec.source.removeprefix("local:")
        if self.store.shell.read_file(f"{path}/config.json") is None:
            raise WeightsError(f"model {spec.model}: {path}/config.json not found on host {self.host.name}",
                               host=self.host.name)
        return StagedWeights(path=path, revision="local", total_bytes=0)

    def verify(self, spec: UnitSpec) -> StagedWeights | None:
        if spec.source.startswith("local:"):
            return self._in_place(spec)
        req = self._request(spec)
        manifest = self.store.verify(req.root, req.name, req.revision)
        return None if manifest is None else StagedWeights(manifest.path, manifest.revision, manifest.total_bytes)


def build_ports(catalog: Catalog, host: Host) -> HostPorts:
    shell, systemd = connect(host.transport, host.address, port=host.ssh_port, user=host.ssh_user,
                             key_filename=host.ssh_key, known_hosts=host.known_hosts, unit_dir=host.unit_dir,
                             host=host.name)
    token_file = f"{catalog.defaults.env_dir.rstrip('/')}/hf-token"
    weights = SpecWeights(HfWeightStore(shell, python=host.python), host, token_file)
    proxy: FrontProxy | None = None
    if catalog.proxy.enabled:
        bind = catalog.proxy.bind or host.bind or catalog.defaults.bind
        proxy = HaproxyProxy(shell, systemd, catalog.proxy, bind,
                             render_unit(catalog.proxy, bind, template_text("orchestrator-proxy.service.j2")),
                             python=host.python, host=host.name)
    return HostPorts(host=host, shell=shell, systemd=systemd, gpus=NvidiaSmiProbe(shell),
                     health=HttpHealthProbe(), clock=SystemClock(), weights=weights,
                     smoke=SmokeBench() if catalog.policy.smoke_bench else None, proxy=proxy)


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
