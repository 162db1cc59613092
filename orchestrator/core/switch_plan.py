"""How a switch changes a host's serving set, pure: which serving models the target replaces (GPUs it
needs, or its served name), and whether the route moves with no gap (handover on disjoint GPUs, beside
when both fit awake) or with one (stop-start). Persisted with the deployment as its plan.

Two catalog models with the same served name are alternates for one route: switching between them
moves the route, with no downtime when their GPUs are disjoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.core.beside import BesideFit
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Mode, UnitSpec
from orchestrator.errors import UsageError


@dataclass(frozen=True)
class Serving:
    """One model serving on the host: its revision and the spec it runs."""

    revision: int
    spec: UnitSpec


@dataclass(frozen=True)
class SwitchPlan:
    """How one switch changes a host's serving set; persisted with the deployment."""

    mode: Mode
    before: tuple[int, ...]  # revisions serving when the switch was planned
    displaced: tuple[int, ...]  # revisions it replaces (GPUs it needs, or the same served name)
    overlapping: tuple[int, ...]  # the displaced ones that must stop before the new one starts
    reason: str

    @property
    def keeps_serving(self) -> bool:
        """The displaced engines serve until the route moves (nothing stops before the target starts)."""
        return self.mode.keeps_serving

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mode": self.mode.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwitchPlan:
        return cls(
            mode=Mode(data["mode"]),
            before=tuple(data["before"]),
            displaced=tuple(data["displaced"]),
            overlapping=tuple(data["overlapping"]),
            reason=str(data["reason"]),
        )


def _gpus(gpus: Iterable[int]) -> str:
    return ",".join(map(str, sorted(gpus)))


def plan_switch(spec: UnitSpec, serving: Sequence[Serving], beside: BesideFit | None = None) -> SwitchPlan:
    """Which serving models ``spec`` replaces, and whether the route can move with no downtime.
    ``beside``: whether ``spec`` fits on its GPUs beside what runs there now (None: not known); a
    stop-start becomes beside when it does and no displaced engine is the target's own unit."""
    wanted = set(spec.gpus)
    overlapping = [s for s in serving if wanted & set(s.spec.gpus) or s.spec.unit_name == spec.unit_name]
    holders = [s for s in serving if s.spec.served_name == spec.served_name]
    displaced = {s.revision for s in overlapping} | {s.revision for s in holders}
    before = tuple(s.revision for s in serving)
    evicted = "".join(
        f"; stops {s.spec.model} (GPU {_gpus(wanted & set(s.spec.gpus))} overlap)"
        for s in overlapping
        if s not in holders
    )
    if not holders:
        mode, reason = Mode.ADD, f"nothing serves {spec.served_name!r} yet: start it on GPU {_gpus(wanted)}"
    elif any(h in overlapping for h in holders):
        old = holders[0].spec
        shared = wanted & set(old.gpus)
        same_unit = any(s.spec.unit_name == spec.unit_name for s in overlapping)
        if beside is not None and beside.fits and not same_unit and not spec.nodes:
            leaving = ", ".join(s.spec.model for s in overlapping)
            return SwitchPlan(
                mode=Mode.BESIDE,
                before=tuple(s.revision for s in serving),
                displaced=tuple(sorted(displaced)),
                overlapping=(),
                reason=(
                    f"no gap: {spec.model} starts beside {leaving} on GPU {_gpus(wanted)} (both fit awake: "
                    f"{beside.text()}); it is checked, the route moves, then {leaving} drain and sleep (or stop)"
                ),
            )
        mode = Mode.STOP_START
        reason = (
            f"{old.model} serves {spec.served_name!r} on GPU {_gpus(old.gpus)} and {spec.model} needs "
            f"GPU {_gpus(shared) or _gpus(wanted)} of them: stop-start, a gap while the GPUs change hands "
            f"(a warm swap's requests wait through it; a cold start's get 503 with Retry-After)"
        )
        if beside is not None and not same_unit and beside.rooms:
            reason += f" (not beside: {beside.text()})"
    else:
        old = holders[0].spec
        mode = Mode.HANDOVER
        reason = (
            f"{spec.model} needs GPU {_gpus(wanted)}, disjoint from {old.model} on GPU {_gpus(old.gpus)}: "
            f"zero-downtime handover (start, check, move the route, drain, stop)"
        )
    return SwitchPlan(
        mode=mode,
        before=before,
        displaced=tuple(sorted(displaced)),
        overlapping=tuple(sorted(s.revision for s in overlapping)),
        reason=reason + evicted,
    )


def check_together(catalog: Catalog, names: Sequence[str]) -> str:
    """Models asked to serve at once: one host with the proxy on, disjoint GPUs, distinct served
    names. Returns the host; raises UsageError naming both models and the GPUs otherwise."""
    hosts = sorted({catalog.model_host(n).name for n in names})
    if len(hosts) != 1:
        raise UsageError(
            f"models {', '.join(names)} run on different hosts ({', '.join(hosts)}): switch them one host at a time"
        )
    if len(names) > 1 and not catalog.proxy.enabled:
        raise UsageError("serving several models on one host needs the front proxy: set [proxy] enabled = true")
    for i, a_name in enumerate(names):
        a = catalog.models[a_name]
        for b_name in names[i + 1 :]:
            b = catalog.models[b_name]
            shared = set(a.gpus) & set(b.gpus)
            if shared:
                raise UsageError(
                    f"{a_name} (GPU {_gpus(a.gpus)}) and {b_name} (GPU {_gpus(b.gpus)}) cannot "
                    f"serve together: both need GPU {_gpus(shared)}"
                )
            if a.served == b.served:
                raise UsageError(
                    f"{a_name} and {b_name} cannot serve together: both are served as "
                    f"{a.served!r} and the proxy routes one engine per name"
                )
    return hosts[0]
