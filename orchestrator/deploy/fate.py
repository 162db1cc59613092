"""What a switch does to the host's other models (core/residency.py decides): which displaced ones
sleep, which stop, which sleepers are evicted to make room, and why; decided in staging, before the
warm window opens, and persisted with the deployment so that a resumed run acts on the same decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.core import residency as rules
from orchestrator.core.resident import ASLEEP, State
from orchestrator.deploy.context import StepContext, StepInput
from orchestrator.deploy.residents import is_asleep, loaded_gib, note

FATE_EVENT = "fate"  # the warm note with the displaced models' fate, decided in staging


@dataclass(frozen=True)
class Fate:
    sleep: tuple[str, ...]  # displaced models that sleep
    stop: tuple[str, ...]  # displaced models that stop
    evict: tuple[str, ...]  # sleepers stopped to make room
    reasons: tuple[str, ...]
    weights: Mapping[str, float] = field(default_factory=dict)  # displaced model -> GiB of weights (du)
    why: Mapping[str, str] = field(default_factory=dict)  # model -> the decision's first reason about it

    def reason(self, model: str, default: str = "") -> str:
        return self.why.get(model, default)


def fate(ctx: StepContext, step: StepInput) -> Fate:
    """core.residency's decision for this switch, from the catalog and the recorded residency."""
    host = ctx.ports.host
    records = ctx.residency.residency(host.name) if ctx.residency is not None else {}
    displaced = {d.model: d.spec for d in step.displaced}
    residents = []
    sizes = {name: loaded_gib(ctx, spec) for name, spec in displaced.items()}
    for name in ctx.catalog.models_on(host.name):
        model = ctx.catalog.models[name]
        rec = records.get(name)
        # Observed, not only recorded: a unit stopped behind the records' back holds nothing.
        state = State.STOPPED
        if ctx.ports.systemd.unit_state(model.unit_name).is_active:
            state = State.ASLEEP if rec is not None and rec.state == ASLEEP else State.SERVING
        if name == step.dep.model:
            state = State.ASLEEP if is_asleep(ctx, step.dep.spec) else State.STOPPED
        size = sizes[name] if name in displaced else (rec.weights_gib if rec else 0.0)
        residents.append(
            rules.Resident(
                name=name,
                gpus=model.gpus,
                gpu_memory_utilization=rules.utilization(ctx.catalog, model),
                sleep=model.sleep,
                weights_gib=size,
                state=state,
                level=rec.level if rec is not None else None,
                last_served=rec.last_served if rec is not None else None,
                served_name=model.served,
            )
        )
    decision = rules.decide(
        step.dep.model, residents, rules.budgets_for(host, _mem_total_gib(ctx)), displaced=list(displaced)
    )
    why = {r.model: decision.reason(r.model) for r in decision.reasons}
    return Fate(decision.sleep, decision.stop, decision.evict, tuple(r.text for r in decision.reasons), sizes, why)


def decide(ctx: StepContext, step: StepInput) -> Fate:
    """Decide (and persist) what the switch does to the displaced models before the window opens:
    the sleeping step then only acts (no unit reads, no ``du`` between the route move and the wake)."""
    decided = fate(ctx, step)
    note(
        ctx,
        FATE_EVENT,
        sleep=list(decided.sleep),
        stop=list(decided.stop),
        evict=list(decided.evict),
        reasons=list(decided.reasons),
        weights=dict(decided.weights),
        why=dict(decided.why),
    )
    return decided


def recorded_fate(step: StepInput) -> Fate | None:
    """The decision ``decide`` persisted for this deployment (a resumed run acts on the same one)."""
    for p in reversed(step.warm_progress):
        if p.get("step") == FATE_EVENT:
            return Fate(
                tuple(p.get("sleep", ())),
                tuple(p.get("stop", ())),
                tuple(p.get("evict", ())),
                tuple(p.get("reasons", ())),
                dict(p.get("weights", {})),
                dict(p.get("why", {})),
            )
    return None


def _mem_total_gib(ctx: StepContext) -> float | None:
    """The box's MemTotal (for a host without memory_gib or sleep_ram_gib)."""
    if ctx.ports.host.sleep_ram_gib is not None or ctx.ports.host.memory_gib is not None:
        return None
    data = ctx.ports.shell.read_file("/proc/meminfo") or b""
    for line in data.decode(errors="replace").splitlines():
        if line.startswith("MemTotal:") and line.split()[1].isdigit():
            return int(line.split()[1]) / 2**20
    return None
