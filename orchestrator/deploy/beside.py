"""The GPU reading behind a beside switch (core.beside): who holds what on the target's GPUs now.

Used when the switch is planned (``plan``, ``switch --dry-run``, the recorded plan) and again before
the target starts or wakes, so a start beside never runs on a count that went stale.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.core import residency as rules
from orchestrator.core.beside import BesideFit, Holder, beside_fit
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import UnitSpec
from orchestrator.core.resident import ASLEEP
from orchestrator.ports import HostPorts, ResidencyStore


def _utilization(catalog: Catalog, model: str) -> float:
    m = catalog.models.get(model)
    return rules.utilization(catalog, m) if m is not None else catalog.defaults.gpu_memory_utilization


def room_beside(
    ports: HostPorts, catalog: Catalog, residency: ResidencyStore | None, target: UnitSpec, awake: Iterable[UnitSpec]
) -> BesideFit:
    """Whether ``target`` fits on its GPUs while ``awake`` keep serving and the host's sleepers keep
    their residue (one nvidia-smi snapshot; raises what the GPU probe raises)."""
    sd = ports.systemd
    residue = int(ports.host.sleep_residue_gib * 1024)
    holders = [
        Holder(s.model, s.gpus, frozenset(sd.cgroup_pids(s.unit_name)), utilization=_utilization(catalog, s.model))
        for s in awake
        if s.unit_name != target.unit_name
    ]
    named = {h.name for h in holders}
    records = residency.residency(ports.host.name) if residency is not None else {}
    for name, rec in records.items():
        if rec.state != ASLEEP or name == target.model or name in named or not rec.unit:
            continue
        model = catalog.models.get(name)
        holders.append(
            Holder(
                name,
                model.gpus if model is not None else (),
                frozenset(sd.cgroup_pids(rec.unit)),
                asleep=True,
                residue_mib=residue,
            )
        )
    own = sd.cgroup_pids(target.unit_name)
    return beside_fit(
        ports.gpus.snapshot(),
        target.gpus,
        utilization=_utilization(catalog, target.model),
        holders=holders,
        own_pids=own,
    )
