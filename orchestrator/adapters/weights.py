"""The engine's WeightStore port (ports.py) over the host's weight store (weights_hf.py): a UnitSpec
in, verified weights out; the catalog's peers for ``host:NAME`` sources; cleanup of old revisions."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from orchestrator.adapters.weights_hf import HfWeightStore
from orchestrator.core.catalog import Host
from orchestrator.core.records import UnitSpec
from orchestrator.core.weights import PeerSpec, StagedRevision, StageRequest, protected_pairs
from orchestrator.errors import WeightsError
from orchestrator.ports import ProgressCallback, StagedWeights


class SpecWeights:
    """The engine's WeightStore port over the Hugging Face store: a UnitSpec in, verified weights out."""

    def __init__(
        self,
        store: HfWeightStore,
        host: Host,
        token_file: str | None,
        *,
        fleet: Mapping[str, Host] | None = None,
        keep_revisions: int = 0,
    ) -> None:
        self.store = store
        self.host = host
        self.token_file = token_file
        self.fleet = fleet or {}  # the catalog's hosts: peers a ``host:NAME`` source copies from
        self.keep_revisions = keep_revisions

    def _request(self, spec: UnitSpec) -> StageRequest:
        return StageRequest(
            name=spec.repo.replace("/", "--"),
            repo=spec.repo,
            revision=spec.revision,
            root=self.host.models_dir,
            source=spec.source,
            token_file=self.token_file,
            endpoint=os.environ.get("HF_ENDPOINT"),
            peer=self._peer(spec),
            keep_revisions=self.keep_revisions,
            unit_dir=self.host.unit_dir,
        )

    def _peer(self, spec: UnitSpec) -> PeerSpec | None:
        """The peer of a ``host:NAME`` source, reached from this host with the peer's catalog entry
        (address, port, user; its key and known_hosts paths must exist on this host too)."""
        if not spec.source.startswith("host:"):
            return None
        name = spec.source.removeprefix("host:")
        peer = self.fleet.get(name)
        if peer is None:
            raise WeightsError(
                f"model {spec.model}: source {spec.source!r} names no host of the catalog", host=self.host.name
            )
        return PeerSpec(
            address=peer.address,
            root=peer.models_dir,
            port=peer.ssh_port,
            user=peer.ssh_user,
            key_file=peer.ssh_key,
            known_hosts=peer.known_hosts,
        )

    def cleanup(self, keep_serving: Iterable[UnitSpec]) -> list[StagedRevision]:
        """Remove old staged revisions on this host: keep policy.keep_revisions newest per repo and
        never the revisions of ``keep_serving`` (the serving and the previous stable deployment's
        specs) nor one an installed engine unit of this host names (a model serving on other
        GPUs). Call after a deployment became active; a no-op when keep_revisions is 0."""
        if self.keep_revisions <= 0:
            return []
        root = self.host.models_dir
        specs = list(keep_serving)
        protected = protected_pairs([s.model_dir for s in specs], root)
        protected |= {(s.repo.replace("/", "--"), s.revision) for s in specs}
        return self.store.cleanup(root, keep=self.keep_revisions, protected=protected, unit_dir=self.host.unit_dir)

    def stage(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        if spec.source.startswith("local:"):
            return self._in_place(spec, progress)
        manifest = self.store.stage(self._request(spec), progress)
        return StagedWeights(path=manifest.path, revision=manifest.revision, total_bytes=manifest.total_bytes)

    def _in_place(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        """Weights the operator keeps in a directory of the host: used where they are, once verified
        like every other source (index, sizes, safetensors headers, the sha256 where one is known)."""
        path = spec.source.removeprefix("local:")
        try:
            done = self.store.check(path)
        except WeightsError as exc:
            raise WeightsError(f"model {spec.model}: {exc.message}", host=self.host.name) from exc
        checked: dict[str, object] = {k: done[k] for k in ("files", "bytes", "sha256_checked", "checked") if k in done}
        progress("stage_verified", {"host": self.host.name, "model": spec.model, "path": path, **checked})
        return StagedWeights(path=path, revision="local", total_bytes=int(str(done.get("bytes", 0))))

    def verify(self, spec: UnitSpec) -> StagedWeights | None:
        if spec.source.startswith("local:"):
            return self._in_place(spec, lambda e, f: None)
        req = self._request(spec)
        manifest = self.store.verify(req.root, req.name, req.revision)
        return None if manifest is None else StagedWeights(manifest.path, manifest.revision, manifest.total_bytes)
