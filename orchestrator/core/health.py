"""Readiness verdicts: when a starting server counts as serving, still loading, or failed.

``/health`` can answer 200 while every request fails (testbed: head_dim 16), so readiness is all
three of /health, /v1/models naming the served model, and one real completion. A unit that
failed or restarted while we waited is a verdict on its own: waiting longer cannot help.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from orchestrator.core.observed import UnitState


class Readiness(StrEnum):
    READY = "ready"
    WAITING = "waiting"
    FAILED = "failed"


@dataclass(frozen=True)
class Verdict:
    readiness: Readiness
    detail: str


def judge_unit(unit: UnitState, restarts_before: int) -> Verdict | None:
    """A FAILED verdict when systemd already says the server is gone, else None (keep probing)."""
    if unit.is_failed:
        return Verdict(Readiness.FAILED, f"{unit.name} entered failed ({unit.result}, exit status "
                                         f"{unit.exec_main_status})")
    if unit.n_restarts > restarts_before:
        return Verdict(Readiness.FAILED, f"{unit.name} exited and was restarted by systemd "
                                         f"{unit.n_restarts - restarts_before} time(s) while loading")
    if not unit.is_active and unit.active_state != "activating":
        return Verdict(Readiness.FAILED, f"{unit.name} is {unit.active_state}/{unit.sub_state}, not running")
    return None


def judge_models(served: list[str], expected: str) -> Verdict:
    if expected in served:
        return Verdict(Readiness.READY, f"/v1/models lists {expected}")
    return Verdict(Readiness.WAITING, f"/v1/models lists {served or 'nothing'}, not {expected!r}")
