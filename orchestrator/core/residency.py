"""Residency of a host's models for warm switches, pure: which engines sleep, stop or are evicted when
a model is switched to, and whether its wake (or cold start) fits the GPUs.

Each model of a host is serving, asleep (at a level) or stopped. The GPUs hold every serving engine's
``gpu_memory_utilization`` share and, per sleeper, the residue a sleeping engine keeps on each of its
GPUs; host RAM holds every level1 sleeper's weights (level2 drops them), within the host's budget.
When room runs short the least recently served sleeper goes first (a model never served counts as
the oldest), then a displaced model that would have slept is stopped instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.core.catalog import Catalog, Host, Model
from orchestrator.core.resident import State
from orchestrator.engines import ENGINE, engine_named

# Float sums of GiB figures: a budget that fits exactly must not fail on rounding.
_EPS = 1e-6


class Why(StrEnum):
    """What a reason says about its model."""

    SERVING = "serving"  # the target serves already
    NO_SLEEP_MODE = "no_sleep_mode"  # a displaced model stops: it has no sleep mode
    STOPS = "stops"  # a displaced model stops instead of sleeping (no room in RAM or on its GPUs)
    EVICTED = "evicted"  # a sleeper stops to make room
    SLEEPS = "sleeps"  # a displaced model sleeps
    NO_FIT = "no_fit"  # the target does not fit its GPUs


@dataclass(frozen=True)
class Reason:
    """One line of a decision, about one model: callers ask by model and kind, never parse the text."""

    model: str
    why: Why
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Resident:
    """One model of the host as the decision sees it."""

    name: str
    gpus: tuple[int, ...]
    gpu_memory_utilization: float  # the share of each of its GPUs it takes when awake
    sleep: str | None = None  # its catalog `sleep`: "level1", "level2" or None (no sleep mode)
    weights_gib: float = 0.0  # host RAM it holds asleep at level1 (all ranks' weights)
    state: State = State.STOPPED
    level: str | None = None  # the level it sleeps at, when asleep
    last_served: float | None = None  # when it last served (epoch seconds); None: never
    served_name: str = ""  # the route it serves; a serving holder of the target's is displaced too
    engine: str = ENGINE.name  # the engine it runs on: says which sleep levels keep the weights in RAM

    @property
    def ram_gib(self) -> float:
        """Host RAM it holds while asleep (its engine's level1 keeps the weights there, level2 drops them)."""
        level = self.level or self.sleep
        return self.weights_gib if level is not None and engine_named(self.engine).sleep_keeps_weights(level) else 0.0


@dataclass(frozen=True)
class Budgets:
    """One host's limits: GiB per GPU, the residue a sleeper keeps per GPU, the RAM for sleepers."""

    gpu_memory_gib: float
    residue_gib: float
    ram_gib: float | None  # None: unknown (no memory_gib, no sleep_ram_gib, not probed): no level1 sleep


@dataclass(frozen=True)
class Decision:
    """What a switch to ``target`` does to the host's other models, and whether the target fits."""

    target: str
    wake: bool  # the target is asleep: wake it (a warm switch); else it cold-starts
    sleep: tuple[str, ...]  # displaced serving models that go to sleep, each at its catalog level
    stop: tuple[str, ...]  # displaced serving models that stop (no sleep mode, or no room)
    evict: tuple[str, ...]  # sleepers stopped to make room, least recently served first
    fits: bool  # the target's GPUs have its share free once the above is done
    ram_gib: float  # host RAM held by sleepers afterwards
    ram_budget_gib: float | None
    gpu_gib: Mapping[int, float]  # per GPU of the target: GiB held by others afterwards (sleepers' residue)
    need_gib: float  # GiB per GPU the target takes awake
    reasons: tuple[Reason, ...] = field(default=())

    def reason(self, model: str, default: str = "") -> str:
        """The first reason the decision gives about ``model``."""
        return next((r.text for r in self.reasons if r.model == model), default)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "wake": self.wake,
            "sleep": list(self.sleep),
            "stop": list(self.stop),
            "evict": list(self.evict),
            "fits": self.fits,
            "ram_gib": round(self.ram_gib, 2),
            "ram_budget_gib": None if self.ram_budget_gib is None else round(self.ram_budget_gib, 2),
            "gpu_gib": {str(g): round(v, 2) for g, v in sorted(self.gpu_gib.items())},
            "need_gib": round(self.need_gib, 2),
            "reasons": [r.text for r in self.reasons],
        }


def _age(r: Resident) -> float:
    return float("-inf") if r.last_served is None else r.last_served


def decide(
    target: str, residents: Sequence[Resident], budgets: Budgets, displaced: Iterable[str] | None = None
) -> Decision:
    """What switching the host to ``target`` sleeps, stops and evicts, and whether it then fits.

    ``residents``: every model of the host (the target included) with its state. ``displaced``: the
    serving models the switch replaces (``core.switch_plan.plan_switch``); by default those on the target's
    GPUs or serving its name. The target itself is never slept nor evicted."""
    by_name = {r.name: r for r in residents}
    if target not in by_name:
        raise ValueError(f"target {target!r} is not one of the host's models ({', '.join(sorted(by_name))})")
    t = by_name[target]
    mem = budgets.gpu_memory_gib
    need = t.gpu_memory_utilization * mem
    if displaced is None:
        out = [
            r
            for r in residents
            if r.name != target
            and r.state is State.SERVING
            and (set(r.gpus) & set(t.gpus) or (t.served_name and r.served_name == t.served_name))
        ]
    else:
        wanted = set(displaced)
        out = [r for r in residents if r.name in wanted and r.name != target and r.state is State.SERVING]
    reasons: list[Reason] = []
    if t.state is State.SERVING:
        return Decision(
            target,
            False,
            (),
            (),
            (),
            True,
            sum(r.ram_gib for r in residents if r.state is State.ASLEEP),
            budgets.ram_gib,
            {},
            need,
            (Reason(target, Why.SERVING, f"{target} is already serving"),),
        )
    stop = [r.name for r in out if r.sleep is None]
    for name in stop:
        reasons.append(Reason(name, Why.NO_SLEEP_MODE, f"{name} stops: it has no sleep mode (set models.{name}.sleep)"))
    # Sleepers afterwards: those asleep now (not the target), then the displaced that can sleep.
    old = sorted((r for r in residents if r.state is State.ASLEEP and r.name != target), key=_age)
    new = sorted((r for r in out if r.sleep is not None), key=_age)
    evict: list[str] = []
    budget = budgets.ram_gib
    for r in list(new):
        if r.ram_gib > 0 and (budget is None or r.ram_gib > budget + _EPS):
            new.remove(r)
            stop.append(r.name)
            reasons.append(
                Reason(
                    r.name,
                    Why.STOPS,
                    f"{r.name} stops instead of sleeping: its {r.ram_gib:.1f} GiB "
                    "of weights exceed the "
                    + (
                        "host's RAM budget for sleepers (unknown: set memory_gib or sleep_ram_gib)"
                        if budget is None
                        else f"{budget:.1f} GiB RAM budget for sleepers"
                    ),
                )
            )

    def ram() -> float:
        return sum(r.ram_gib for r in old + new)

    def drop(r: Resident, why: str) -> None:
        if r in old:
            old.remove(r)
            evict.append(r.name)
            reasons.append(Reason(r.name, Why.EVICTED, f"{r.name} (asleep, {_served(r)}) is evicted: {why}"))
        else:
            new.remove(r)
            stop.append(r.name)
            reasons.append(Reason(r.name, Why.STOPS, f"{r.name} stops instead of sleeping: {why}"))

    while budget is not None and ram() > budget + _EPS:
        victim = next(r for r in old + new if r.ram_gib > 0)
        drop(victim, f"sleepers would hold {ram():.1f} GiB of host RAM, over the {budget:.1f} GiB budget")
    for r in list(old):  # a level1 sleeper with no RAM budget known cannot stay
        if budget is None and r.ram_gib > 0:
            drop(r, "the host's RAM budget for sleepers is unknown")
    staying = [r for r in residents if r.state is State.SERVING and r not in out and r.name != target]

    def held(g: int) -> float:
        return sum(r.gpu_memory_utilization * mem for r in staying if g in r.gpus) + sum(
            budgets.residue_gib for r in old + new if g in r.gpus
        )

    for g in t.gpus:
        while held(g) + need > mem + _EPS:
            victims = [r for r in old + new if g in r.gpus]
            if not victims:
                break
            drop(victims[0], f"GPU {g} would hold {held(g):.1f} GiB beside {target}'s {need:.1f} GiB of {mem:g} GiB")
    gpu = {g: held(g) for g in t.gpus}
    fits = all(gpu[g] + need <= mem + _EPS for g in t.gpus)
    if not fits:
        g = next(g for g in t.gpus if gpu[g] + need > mem + _EPS)
        holders = ", ".join(r.name for r in staying if g in r.gpus) or "nothing the switch may stop"
        reasons.append(
            Reason(
                target,
                Why.NO_FIT,
                f"{target} does not fit: GPU {g} keeps {gpu[g]:.1f} GiB "
                f"({holders}) and it needs {need:.1f} of {mem:g} GiB",
            )
        )
    for r in new:
        reasons.append(
            Reason(
                r.name,
                Why.SLEEPS,
                f"{r.name} sleeps ({r.sleep}"
                + (f", {r.ram_gib:.1f} GiB in host RAM)" if r.ram_gib else ", weights dropped)"),
            )
        )
    return Decision(
        target=target,
        wake=t.state is State.ASLEEP,
        sleep=tuple(r.name for r in new),
        stop=tuple(stop),
        evict=tuple(evict),
        fits=fits,
        ram_gib=ram(),
        ram_budget_gib=budget,
        gpu_gib=gpu,
        need_gib=need,
        reasons=tuple(reasons),
    )


def _served(r: Resident) -> str:
    if r.last_served is None:
        return "never served"
    if r.last_served < 1e9:  # an order, not a time (plan --asleep)
        return "the least recently served"
    return "last served " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.last_served))


# Catalog-derived settings, shared by validation, rendering, `plan` and the switch.


def budgets_for(host: Host, probed_memory_gib: float | None = None) -> Budgets:
    """The host's budgets; ``probed_memory_gib``: the box's MemTotal, for a host without memory_gib."""
    return Budgets(
        gpu_memory_gib=host.gpu_memory_gib,
        residue_gib=host.sleep_residue_gib,
        ram_gib=host.sleep_ram_budget(probed_memory_gib),
    )


def wake_deadline(catalog: Catalog, model: Model) -> float:
    return model.wake_deadline_s or catalog.defaults.wake_deadline_s


def utilization(catalog: Catalog, model: Model) -> float:
    return model.gpu_memory_utilization or catalog.defaults.gpu_memory_utilization
