"""What a deployment's step is given besides the deployment (deploy/context.py's StepInput), read from
the store and the catalog: the units it stops, on the head and on other nodes, what it brings back on
other nodes, the units the host manages, and what its warm and node steps did so far (persisted as
they ran, so a run resumed after a crash sees it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.core.catalog import Catalog
from orchestrator.core.multinode import unit_names
from orchestrator.core.records import Deployment, Mode, UnitSpec
from orchestrator.core.switch_plan import SwitchPlan
from orchestrator.deploy.multinode import NODE_PROGRESS
from orchestrator.deploy.residents import WARM_EVENT
from orchestrator.ports import HostPorts, StateStore

PortsFactory = Callable[[str], HostPorts]


def warm_progress(store: StateStore, dep: Deployment) -> tuple[dict[str, Any], ...]:
    """What the warm steps of ``dep`` did so far, oldest first (persisted as they ran)."""
    found = store.events(host=dep.host, kind=WARM_EVENT, limit=200)
    return tuple(reversed([e for e in found if e.get("deployment_id") == dep.id]))


def node_progress(store: StateStore, dep: Deployment) -> tuple[dict[str, Any], ...]:
    """What the deployment did on each node of a multi-node model, oldest first, as persisted
    while its steps ran (deploy/multinode.py): it survives a crash in the middle of a step."""
    if not dep.spec.nodes:
        return ()
    found = store.events(host=dep.host, kind=NODE_PROGRESS, limit=500)
    return tuple(reversed([e for e in found if e.get("deployment_id") == dep.id]))


def ready_restarts(store: StateStore, dep: Deployment) -> dict[tuple[str, str], int]:
    """Each unit of a multi-node model: systemd's restart count when a deployment last found it
    ready (the newest record of that very unit text wins: a rollback's restore counts too)."""
    if not dep.spec.nodes:
        return {}
    shas = {(n.host, n.unit_name): n.unit_sha for n in dep.spec.nodes} | {
        (dep.host, dep.spec.unit_name): dep.spec.unit_sha
    }
    out: dict[tuple[str, str], int] = {}
    for e in store.events(host=dep.host, kind=NODE_PROGRESS, limit=500):
        key = (str(e.get("node")), str(e.get("unit")))
        if e.get("step") == "ready" and key not in out and shas.get(key) == e.get("sha256"):
            out[key] = int(e.get("n_restarts") or 0)
    return out


def managed_units(catalog: Catalog, store: StateStore, host: str) -> frozenset[str]:
    """The units the host's catalog models and its recent deployments run under."""
    units = {catalog.models[m].unit_name for m in catalog.models_on(host)}
    units |= {d.spec.unit_name for d in store.history(host, limit=20)}
    return frozenset(units)


def previous(store: StateStore, dep: Deployment) -> Deployment | None:
    """The deployment ``dep`` replaces (its previous stable revision), if any."""
    if dep.previous_revision is None:
        return None
    return store.by_revision(dep.host, dep.previous_revision)


def units_to_stop(
    catalog: Catalog, store: StateStore, dep: Deployment, plan: SwitchPlan | None = None
) -> frozenset[str]:
    """The recorded serving unit, the target itself (redeploy), and any managed unit on our GPUs.

    With the proxy, only the serving models on our GPUs: a handover's (or beside) old engine
    stops later, once the route moved."""
    units = {dep.spec.unit_name}
    if plan is not None:
        units |= {store.by_revision(dep.host, r).spec.unit_name for r in plan.overlapping}
        kept = {
            store.by_revision(dep.host, r).spec.unit_name
            for r in plan.before
            if r not in plan.displaced or plan.mode is Mode.BESIDE
        }
        wanted = set(dep.spec.gpus)
        units |= {
            catalog.models[n].unit_name for n in catalog.models_on(dep.host) if wanted & set(catalog.models[n].gpus)
        }
        return frozenset(units - kept)
    if dep.previous_revision is not None:
        units.add(store.by_revision(dep.host, dep.previous_revision).spec.unit_name)
    wanted = set(dep.spec.gpus)
    for name in catalog.models_on(dep.host):
        if wanted & set(catalog.models[name].gpus):
            units.add(catalog.models[name].unit_name)
    return frozenset(units)


def node_units_to_stop(catalog: Catalog, store: StateStore, dep: Deployment) -> dict[str, frozenset[str]]:
    """Multi-node: units beyond the head's usual ones, by host, in stop order (other nodes in
    reverse, the head's extra units last): the target's and the previous revision's node units,
    what serves on the target's other nodes, and any catalog unit there on the target's GPUs."""
    prev = previous(store, dep)
    specs = [dep.spec] + ([prev.spec] if prev is not None else [])
    hosts = [dep.host, *dep.spec.node_hosts]
    out: dict[str, set[str]] = {}
    for spec in specs:
        for node in reversed(spec.nodes):
            out.setdefault(node.host, set()).add(node.unit_name)
    for peer in hosts[1:]:
        serving = store.serving(peer) if peer != dep.host else None
        if serving is not None:
            out.setdefault(peer, set()).add(serving.spec.unit_name)
    wanted = set(dep.spec.gpus)
    for model in catalog.models.values():
        if dep.spec.nodes and wanted & set(model.gpus):
            for host, units in unit_names(catalog, model).items():
                if host in hosts[1:] or (host == dep.host and model.name != dep.model):
                    out.setdefault(host, set()).update(units)
    order = sorted(out, key=lambda h: (h == dep.host, -hosts.index(h) if h in hosts else 0))
    return {h: frozenset(out[h]) for h in order}


def peer_restore(store: StateStore, dep: Deployment) -> dict[str, UnitSpec]:
    """What serves now on the target's other nodes (single-box models), to bring back on rollback."""
    out = {}
    for peer in dep.spec.node_hosts:
        serving = store.serving(peer) if peer != dep.host else None
        if serving is not None and not serving.spec.nodes:
            out[peer] = serving.spec
    return out
