"""Readiness verdicts: when a starting server counts as serving, still loading, or failed.

``/health`` can answer 200 while every request fails (testbed: head_dim 16), so readiness is all
three of /health, /v1/models naming the served model, and one real completion. A unit that
failed or restarted while we waited is a verdict on its own: waiting longer cannot help.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.core.observed import UnitState
from orchestrator.engines import ENGINE, ENGINES, Engine


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
        return Verdict(
            Readiness.FAILED, f"{unit.name} entered failed ({unit.result}, exit status {unit.exec_main_status})"
        )
    if unit.n_restarts > restarts_before:
        return Verdict(
            Readiness.FAILED,
            f"{unit.name} exited and was restarted by systemd "
            f"{unit.n_restarts - restarts_before} time(s) while loading",
        )
    if not unit.is_active and unit.active_state != "activating":
        return Verdict(Readiness.FAILED, f"{unit.name} is {unit.active_state}/{unit.sub_state}, not running")
    return None


def judge_models(served: list[str], expected: str, engine: Engine = ENGINE) -> Verdict:
    if expected in served:
        return Verdict(Readiness.READY, f"{engine.models_path} lists {expected}")
    return Verdict(Readiness.WAITING, f"{engine.models_path} lists {served or 'nothing'}, not {expected!r}")


def engine_errors(lines: Sequence[str], limit: int = 3, width: int = 300) -> list[str]:
    """The last distinct exception lines of an engine's log ("RuntimeError: Unsupported ..."), trimmed,
    oldest first: the reason an engine died comes after whatever it logged while starting."""
    found: list[str] = []
    for line in reversed(lines):
        said = next((r for r in (e.reason(line) for e in ENGINES.values()) if r is not None), None)
        if said is None:
            continue
        text = f"{said[0]}: {said[1].strip()}"
        text = text if len(text) <= width else text[:width] + " [...]"
        if text not in found:
            found.append(text)
        if len(found) == limit:
            break
    return found[::-1]
