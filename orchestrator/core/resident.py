"""What the host's records say about each model's residency for warm switches (pure data).

A model on a host is serving, asleep (at a level) or stopped. The record keeps when that began and
when the model last served: the least recently served sleeper is the one evicted first.
"""

from __future__ import annotations

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
        return {"model": self.model, "state": self.state, "level": self.level, "since": self.since,
                "last_served": self.last_served, "unit": self.unit, "ram_gib": round(self.ram_gib, 3)}
