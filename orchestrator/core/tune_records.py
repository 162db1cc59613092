"""The records of a tune run and its candidates, as the tune store keeps them (pure data: the port in
ports.py and the SQLite adapter both speak them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RUNNING = "running"  # a run's state until it ends


@dataclass(frozen=True)
class TuneRun:
    id: int
    host: str
    model: str
    created_at: float
    settings: dict[str, Any]
    previous_revision: int | None
    state: str
    ended_at: float | None
    result: dict[str, Any] | None


@dataclass(frozen=True)
class TuneResult:
    run_id: int
    candidate: str
    layout: str
    status: str  # "ok" | "failed"
    deployment_id: int | None
    revision: int | None
    error: str | None  # the engine's own line
    detail: str | None  # the whole error of the switch
    records: list[dict[str, Any]]  # bench records, one per repeat
    at: float
