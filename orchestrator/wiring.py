"""Choose the adapters for each host once, at start-up, and build the operations on them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from orchestrator.adapters import connect
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.adapters.smoke import SmokeBench
from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.records import Deployment, UnitSpec
from orchestrator.core.weights import PeerSpec, StagedRevision, StageRequest, protected_pairs
from orchestrator.deploy.operations import Operations
from orchestrator.errors import WeightsError
from orchestrator.ports import HostPorts, ProgressCallback, StagedWeights


class SpecWeights:
    """The engine's WeightStore port over the Hugging Face store: a UnitSpec in, verified weights out."""

    def __init__(self, store: HfWeightStore, host: Host, token_file: str | None, *,
                 fleet: Mapping[str, Host] | None = None, keep_revisions: int = 0) -> None:
        self.store = store
        self.host = host
        self.token_file = token_file
        self.fleet = fleet or {}  # the catalog's hosts: peers a ``host:NAME`` source copies from
        self.keep_revisions = keep_revisions

    def _request(self, spec: UnitSpec) -> StageRequest:
        return StageRequest(name=spec.repo.replace("/", "--"), repo=spec.repo, revision=spec.revision,
                            root=self.host.models_dir, source=spec.source, token_file=self.token_file,
                            endpoint=os.environ.get("HF_ENDPOINT"), peer=self._peer(spec),
                            keep_revisions=self.keep_revisions, unit_dir=self.host.unit_dir)

    def _peer(self, spec: UnitSpec) -> PeerSpec | None:
        """The peer of a ``host:NAME`` source, reached from this host with the peer's catalog entry
        (address, port, user; its key and known_hosts paths must exist on this host too)."""
        if not spec.source.startswith("host:"):
            return None
        name = spec.source.removeprefix("host:")
        peer = self.fleet.get(name)
        if peer is None:
            raise WeightsError(f"model {spec.model}: source {spec.source!r} names no host of the catalog",
                               host=self.host.name)
        return PeerSpec(address=peer.address, root=peer.models_dir, port=peer.ssh_port, user=peer.ssh_user,
                        key_file=peer.ssh_key, known_hosts=peer.known_hosts)

    def cleanup(self, keep_serving: Iterable[UnitSpec]) -> list[StagedRevision]:
        """Remove old staged revisions on this host: keep policy.keep_revisions newest per repo and
        never the revisions of ``keep_serving`` (the serving and the previous stable deployment's
        specs) nor one an installed vllm-*.service unit of this host names (a model serving on other
        GPUs). Call after a deployment became active; a no-op when keep_revisions is 0."""
        if self.keep_revisions <= 0:
            return []
        root = self.host.models_dir
        specs = list(keep_serving)
        protected = protected_pairs([s.model_dir for s in specs], root)
        protected |= {(s.repo.replace("/", "--"), s.revision) for s in specs}
        return self.store.cleanup(root, keep=self.keep_revisions, protected=protected,
                                  unit_dir=self.host.unit_dir)

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
