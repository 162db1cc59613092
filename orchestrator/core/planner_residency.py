"""`plan`'s warm-switch half, pure: which of a host's models can sleep together in its RAM budget and
beside each other on the GPUs, and what a switch to a model sleeps, stops and evicts
(``core.residency.decide`` on the host's states)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.core.catalog import Catalog, Host
from orchestrator.core.catalog_rules import ram_reserve_gib
from orchestrator.core.residency import Budgets, Decision, Resident, Why, budgets_for, decide, utilization
from orchestrator.core.resident import State
from orchestrator.errors import UsageError


@dataclass(frozen=True)
class ResidencyPlan:
    host: str
    budgets: Budgets
    budget_source: str  # where the RAM budget comes from, in words
    models: tuple[Resident, ...]  # every model of the host, with the state the switch starts from
    unknown_weights: tuple[str, ...]  # level1 models whose weights size is not known here
    together: tuple[str, ...]  # sleep-enabled models whose sleepers fit the RAM budget at once
    left_out: tuple[str, ...]  # sleep-enabled models beyond that budget
    beside: Mapping[str, Decision]  # each sleep model switched to with every other one asleep
    switch: Decision | None  # the switch to the planned model from the states given

    def to_dict(self) -> dict[str, Any]:
        b = self.budgets
        return {
            "host": self.host,
            "ram_budget_gib": None if b.ram_gib is None else round(b.ram_gib, 2),
            "ram_budget_source": self.budget_source,
            "residue_gib_per_gpu": b.residue_gib,
            "gpu_memory_gib": b.gpu_memory_gib,
            "models": [
                {
                    "name": r.name,
                    "sleep": r.sleep,
                    "gpus": list(r.gpus),
                    "gpu_memory_utilization": r.gpu_memory_utilization,
                    "weights_gib": None if r.name in self.unknown_weights else round(r.weights_gib, 2),
                    "host_ram_asleep_gib": round(r.ram_gib, 2),
                    "state": r.state.value,
                    "last_served": r.last_served,
                }
                for r in self.models
            ],
            "can_sleep_together": list(self.together),
            "left_out": list(self.left_out),
            "beside": {k: v.to_dict() for k, v in self.beside.items()},
            "switch": None if self.switch is None else self.switch.to_dict(),
        }


def budget_source(host: Host) -> str:
    if host.sleep_ram_gib is not None:
        return f"hosts.{host.name}.sleep_ram_gib"
    if host.memory_gib is not None:
        return (
            f"hosts.{host.name}.memory_gib {host.memory_gib:g} minus a {ram_reserve_gib(host.memory_gib):.1f} "
            "GiB reserve"
        )
    return (
        f"unknown here: set hosts.{host.name}.memory_gib or sleep_ram_gib (the agent reads the box's "
        "/proc/meminfo); level1 models stop instead of sleeping until it is known"
    )


def check_budget(catalog: Catalog, host: Host, model: str, weights_gib: float | None, what: str) -> None:
    """A level1 model whose weights exceed the host's RAM budget can never sleep: bad input (exit 2),
    naming the host's key and value and the model's weights."""
    m = catalog.models[model]
    budget = host.sleep_ram_budget()
    if m.sleep != "level1" or weights_gib is None or budget is None or weights_gib <= budget:
        return
    key = "sleep_ram_gib" if host.sleep_ram_gib is not None else "memory_gib"
    value = host.sleep_ram_gib if host.sleep_ram_gib is not None else host.memory_gib
    raise UsageError(
        f"hosts.{host.name}.{key} = {value:g} gives a RAM budget of {budget:.1f} GiB for sleeping "
        f'weights, which cannot hold one level1 sleeper: models.{model} (sleep = "level1") has '
        f'{weights_gib:.1f} GiB of weights ({what}); raise {key}, or set sleep = "level2" '
        "(weights dropped, reloaded from disk on wake)"
    )


def plan_residency(
    catalog: Catalog,
    host: Host,
    weights_gib: Mapping[str, float | None],
    *,
    target: str | None = None,
    serving: Sequence[str] = (),
    asleep: Sequence[tuple[str, str | None, float | None]] = (),
) -> ResidencyPlan:
    """The host's residency plan. ``weights_gib``: each model's weights (None: unknown); ``serving``
    and ``asleep`` (name, level, last served) the states a switch to ``target`` starts from."""
    names = catalog.models_on(host.name)
    budgets = budgets_for(host)
    sleeping = {name: (level, last) for name, level, last in asleep}
    unknown = tuple(n for n in names if catalog.models[n].sleep == "level1" and weights_gib.get(n) is None)

    def resident(name: str, state: State) -> Resident:
        m = catalog.models[name]
        level, last = sleeping.get(name, (None, None))
        return Resident(
            name=name,
            gpus=m.gpus,
            gpu_memory_utilization=utilization(catalog, m),
            sleep=m.sleep,
            weights_gib=weights_gib.get(name) or 0.0,
            state=state,
            level=(level or m.sleep) if state is State.ASLEEP else None,
            last_served=last,
            served_name=m.served,
        )

    def state_of(name: str) -> State:
        return State.ASLEEP if name in sleeping else State.SERVING if name in serving else State.STOPPED

    models = tuple(resident(n, state_of(n)) for n in names)
    sleepers = [n for n in names if catalog.models[n].sleep is not None]
    together: list[str] = []
    left_out: list[str] = []
    held = 0.0
    for name in sleepers:  # in catalog order: the file's first models are kept first
        r = resident(name, State.ASLEEP)
        fits = r.ram_gib == 0 or (budgets.ram_gib is not None and held + r.ram_gib <= budgets.ram_gib + 1e-6)
        (together if fits else left_out).append(name)
        held += r.ram_gib if fits else 0.0
    beside: dict[str, Decision] = {}
    for name in sleepers:
        others = [resident(n, State.ASLEEP) for n in together if n != name]
        beside[name] = decide(name, [resident(name, State.STOPPED), *others], budgets)
    switch = decide(target, models, budgets) if target is not None else None
    return ResidencyPlan(
        host=host.name,
        budgets=budgets,
        budget_source=budget_source(host),
        models=models,
        unknown_weights=unknown,
        together=tuple(together),
        left_out=tuple(left_out),
        beside=beside,
        switch=switch,
    )


def render_residency(plan: ResidencyPlan) -> list[str]:
    """The readable form, for `plan` without --json."""
    b = plan.budgets
    ram = "unknown" if b.ram_gib is None else f"{b.ram_gib:.1f} GiB"
    lines = [
        (
            f"warm switches on {plan.host}: RAM for sleepers {ram} ({plan.budget_source}); a sleeper keeps "
            f"{b.residue_gib:g} GiB on each of its GPUs of {b.gpu_memory_gib:g} GiB"
        )
    ]
    for r in plan.models:
        weights = (
            f"weights unknown here (not counted in RAM: set models.{r.name}.config)"
            if r.name in plan.unknown_weights
            else f"weights {r.weights_gib:.1f} GiB"
        )
        asleep = (
            f"asleep holds {r.ram_gib:.1f} GiB RAM"
            if r.sleep == "level1"
            else "asleep holds no RAM"
            if r.sleep == "level2"
            else "no sleep mode: stops"
        )
        lines.append(
            f"  {r.name}: {r.sleep or 'no sleep'}, GPU {','.join(map(str, r.gpus))} at "
            f"{r.gpu_memory_utilization:g}, {weights}, {asleep}, now {r.state.value}"
        )
    if plan.together:
        lines.append(f"  can sleep together: {', '.join(plan.together)}")
    if plan.left_out:
        lines.append(
            f"  beyond the RAM budget: {', '.join(plan.left_out)} (the least recently served sleeper "
            "is evicted to make room)"
        )
    for name, each in plan.beside.items():
        extra = [x.text for x in each.reasons if x.why is not Why.SLEEPS]
        lines.append(
            f"  {name} awake beside the others asleep: "
            + ("fits" if each.fits and not extra else "; ".join(extra) or "does not fit")
        )
    d = plan.switch
    if d is not None:
        state = next(r.state for r in plan.models if r.name == d.target)
        how = (
            "already serving"
            if state is State.SERVING
            else "warm: it wakes"
            if d.wake
            else "cold start" + ("" if d.fits else ", which does not fit")
        )
        lines.append(f"switch to {d.target}: {how}")
        lines.extend(f"  - {x}" for x in d.reasons if state is not State.SERVING)
        if state is not State.SERVING and not (d.sleep or d.stop or d.evict):
            lines.append("  - nothing else sleeps, stops or is evicted")
    return lines
