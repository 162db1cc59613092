"""`orchestrator adopt`'s two halves over the records: what the found engines' entries would be (printed
for review, each checked by rendering it), and, once deploy.toml holds them, a revision per engine that
records what runs now (trigger ``adopt``), so that the first switch away can be rolled back to it."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from orchestrator.core import adopt as a
from orchestrator.core.catalog import Catalog, Host, Model
from orchestrator.core.records import UnitSpec
from orchestrator.core.render import engine_address, engine_argv, load_deadline, model_dir_for
from orchestrator.deploy import actions
from orchestrator.deploy.adopt import discover
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.deployer import record_running
from orchestrator.deploy.planning import unit_spec
from orchestrator.errors import AdoptError, OrchestratorError
from orchestrator.ports import HostPorts, StateStore

TRIGGER = "adopt"


def _ours(store: StateStore, host: str) -> tuple[set[str], set[int]]:
    """Units and adopted PIDs the product already knows on ``host``: its revisions'. (A catalog model's unit
    name is not enough: the seeds wrote units named as the product names them by hand; a rendered unit says so in its
    first line, which discovery reads.)"""
    history = store.history(host, limit=200)
    units = {d.spec.unit_name for d in history if d.spec.pid is None}
    return units, {d.spec.pid for d in history if d.spec.pid is not None}


def _target(catalog: Catalog, host: Host, *, but: str | None = None) -> a.Target:
    on = [m for m in catalog.models_on(host.name) if m != but]
    return a.Target(
        host=host.name,
        engine=catalog.engine_command(host),
        bind=host.bind or catalog.defaults.bind,
        user=catalog.defaults.user,
        env_dir=catalog.defaults.env_dir,
        taken=frozenset(m for m in catalog.models if m != but),
        ports=frozenset(catalog.models[m].port for m in on),
    )


def _found(store: StateStore, ports: HostPorts, units: list[str], pids: list[int]) -> list[a.Found]:
    ours, adopted = _ours(store, ports.host.name)
    return [f for f in discover(ports, units, pids, ours) if f.pid is None or f.pid not in adopted]


# What an entry deploy.toml already has must agree on, for the engine to be adopted under it as it is.
_SAME = ("served", "port", "gpus")
_COMPARED = (
    "served",
    "port",
    "gpus",
    "tensor_parallel",
    "pipeline_parallel",
    "data_parallel",
    "expert_parallel",
    "max_model_len",
    "max_num_seqs",
    "args",
    "source",
)


def _adoption(catalog: Catalog, host: Host, found: a.Found) -> a.Adoption:
    """The engine's adoption; when deploy.toml already has a model of its name on this host (written by hand
    before, as the seeds' was), judged against that entry rather than refused for the name."""
    adoption = a.adopt(found, _target(catalog, host))
    if adoption.name in catalog.models_on(host.name):
        adoption = a.adopt(found, _target(catalog, host, but=adoption.name))
    return adoption


def _checked(catalog: Catalog, host: Host, adoption: a.Adoption) -> dict[str, Any]:
    """The adoption as printed: its entry validated as deploy.toml would, and the command its unit would
    run compared with the one that runs (token for token, flags in the renderer's order); ``in_config``
    when deploy.toml's own entry of that name already describes it (nothing to add, only the revision)."""
    out = adoption.to_dict() | {"toml": a.entry_toml(adoption, host.name), "differences": [], "in_config": False}
    try:
        model = Model.model_validate({**adoption.entry, "name": adoption.name, "host": host.name})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        out["blockers"] = [*out["blockers"], f"the entry is not valid in deploy.toml: {problems}"]
        return out
    existing = catalog.models.get(adoption.name) if adoption.name in catalog.models_on(host.name) else None
    if existing is not None:
        mismatch = [k for k in _SAME if getattr(existing, k) != getattr(model, k)]
        if mismatch:
            out["blockers"] = [
                *out["blockers"],
                f"deploy.toml's model {existing.name} has "
                + ", ".join(f"{k} {getattr(existing, k)!r}" for k in mismatch)
                + " but it runs with "
                + ", ".join(f"{k} {getattr(model, k)!r}" for k in mismatch)
                + ": rename the unit or fix the entry",
            ]
            return out
        out["in_config"], out["toml"] = True, ""
        other = [k for k in _COMPARED if getattr(existing, k) != getattr(model, k)]
        if other:
            out["notes"] = [
                *out["notes"],
                (
                    f"deploy.toml's model {existing.name} differs from what runs in "
                    f"{', '.join(other)}: the revision keeps what runs; a switch to {existing.name} runs "
                    "the entry"
                ),
            ]
        model = existing
    rendered = engine_argv(catalog, model, model_dir_for(catalog, model, host=host), host)
    out["rendered_argv"] = rendered
    out["differences"] = a.same_command(adoption.found.argv, rendered, adoption.explicit, tuple(model.args))
    return out


def find(catalog: Catalog, store: StateStore, ports: HostPorts, units: list[str], pids: list[int]) -> dict[str, Any]:
    """Each engine the box runs outside the product, with its entry for review (nothing changes)."""
    host = ports.host
    adoptions = [_checked(catalog, host, _adoption(catalog, host, f)) for f in _found(store, ports, units, pids)]
    return {"host": host.name, "adopted": adoptions, "toml": "".join("\n" + x["toml"] for x in adoptions if x["toml"])}


def record(
    catalog: Catalog, store: StateStore, ports: HostPorts, units: list[str], pids: list[int], template: str, now: float
) -> dict[str, Any]:
    """A revision (trigger ``adopt``) for each found engine whose entry deploy.toml now holds: a unit's own
    text (a rollback reinstalls it as it was), or a hand-run process's PID with its entry's rendered unit."""
    host = ports.host
    found = _found(store, ports, units, pids)
    if not found:
        return {"host": host.name, "recorded": []}
    if not catalog.proxy.enabled and (len(found) > 1 or store.serving(host.name) is not None):
        serving = store.serving(host.name)
        what = (
            f"{serving.model} serves there as revision {serving.revision}"
            if serving is not None
            else f"{len(found)} engines run there ({', '.join(f.label for f in found)})"
        )
        raise AdoptError(
            f"without the front proxy a host serves one model, and {what}: name one unit to adopt, or turn [proxy] on",
            host=host.name,
        )
    recorded = []
    for engine in found:
        adoption = _adoption(catalog, host, engine)
        model = catalog.models.get(adoption.name)
        if model is None:
            raise AdoptError(
                f"{engine.label}: deploy.toml has no model {adoption.name!r}: apply its entry first "
                "(`orchestrator adopt --apply` pushes it, then records)",
                host=host.name,
            )
        if model.port != adoption.entry["port"] or list(model.gpus) != adoption.entry["gpus"]:
            raise AdoptError(
                f"{engine.label}: model {model.name} in deploy.toml has port {model.port}, gpus "
                f"{list(model.gpus)}; it runs with port {adoption.entry['port']}, gpus "
                f"{adoption.entry['gpus']}: the entry no longer describes it",
                host=host.name,
            )
        spec = _spec(catalog, host, model, engine, template)
        dep = record_running(store, host.name, spec, TRIGGER, now, in_set=catalog.proxy.enabled)
        store.record_event(
            now,
            host.name,
            "adopted",
            {"model": model.name, "revision": dep.revision, "unit": engine.unit, "pid": engine.pid},
        )
        recorded.append({"model": model.name, "revision": dep.revision, "unit": spec.unit_name, "pid": spec.pid})
    out: dict[str, Any] = {"host": host.name, "recorded": recorded}
    if catalog.proxy.enabled:
        out["proxy"] = _route(catalog, store, ports)
    return out


def _route(catalog: Catalog, store: StateStore, ports: HostPorts) -> str:
    """With the front proxy: it routes the serving set, the adopted engines in it, from now on."""
    ctx = StepContext(ports=ports, catalog=catalog, progress=lambda event, fields: None)
    try:
        changed = actions.route(ctx, [d.spec for d in store.serving_set(ports.host.name)])
    except OrchestratorError as exc:  # recorded all the same: the first switch routes again
        return f"not routed: {exc}"
    return "routed" if changed else "unchanged"


def _spec(catalog: Catalog, host: Host, model: Model, engine: a.Found, template: str) -> UnitSpec:
    if engine.unit is not None:
        text = engine.unit_text
        return UnitSpec(
            model=model.name,
            unit_name=engine.unit,
            unit_text=text,
            unit_sha=hashlib.sha256(text.encode()).hexdigest(),
            served_name=model.served,
            address=engine_address(catalog, model, host),
            port=model.port,
            gpus=model.gpus,
            load_deadline_s=load_deadline(catalog, model),
            model_dir=model_dir_for(catalog, model, host=host),
            repo=model.repo,
            revision=model.revision,
            source=model.source,
            engine=model.engine_name,
        )
    if engine.pid is None or engine.pid_start is None:
        raise AdoptError(f"{engine.label}: neither a unit nor a process with a start time", host=host.name)
    return replace(unit_spec(catalog, model, template), pid=engine.pid, pid_start=engine.pid_start)
