"""What the host's records say about each model's residency for warm switches (pure data).

A model on a host is serving, asleep (at a level) or stopped. The record keeps when that began and
when the model last served: the least recently served sleeper is the one evicted first.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    """A model's residency on a host: the records, the planner's decision and `status` use these."""

    SERVING = "serving"
    ASLEEP = "asleep"
    STOPPED = "stopped"


SERVING, ASLEEP, STOPPED = State.SERVING, State.ASLEEP, State.STOPPED
STATES = tuple(State)


@dataclass(frozen=True)
class Residency:
    host: str
    model: str
    state: str  # one of STATES
    since: float  # epoch seconds the state began
    level: str | None = None  # "level1" | "level2" while asleep
    last_served: float | None = None  # when it last stopped serving (or now, while serving); None: never
    unit: str = ""
    weights_gib: float = 0.0  # the size of its weights: the host RAM it holds asleep at level1

    @property
    def ram_gib(self) -> float:
        return self.weights_gib if self.state == ASLEEP and self.level == "level1" else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "state": self.state,
            "level": self.level,
            "since": self.since,
            "last_served": self.last_served,
            "unit": self.unit,
            "ram_gib": round(self.ram_gib, 3),
        }


# The residency gauge's states (orchestrator_model_residency): serving reads "awake" there, as on the
# dashboard; an asleep series carries the sleep level ("1", "2").
AWAKE = "awake"


def residency_series(
    models: Mapping[str, str | None], serving: Collection[str], records: Mapping[str, Residency]
) -> list[tuple[str, str, str, int]]:
    """(model, state, level, 1 or 0) for each state each of ``models`` (name -> its sleep level, None:
    it never sleeps) can be in, 1 for the current one: awake when in the ``serving`` set (a box
    without warm switches keeps no records of it), else asleep by its record, else stopped; a
    sleeper's level is the one it sleeps at, else its configured one."""
    out: list[tuple[str, str, str, int]] = []
    for name in sorted(models):
        rec = records.get(name)
        state = SERVING if name in serving else ASLEEP if rec is not None and rec.state == ASLEEP else STOPPED
        level = (rec.level if rec is not None and state == ASLEEP and rec.level else models[name]) or ""
        possible = [(AWAKE, SERVING), *([("asleep", ASLEEP)] if level or state == ASLEEP else []), ("stopped", STOPPED)]
        out += [
            (name, label, level.removeprefix("level") if kind == ASLEEP else "", int(kind == state))
            for label, kind in possible
        ]
    return out
