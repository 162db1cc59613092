"""When schedules fire (pure: times in, decisions out; croniter does the cron arithmetic)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from orchestrator.core.catalog import Schedule
from orchestrator.errors import ConfigError


def _zone(s: Schedule) -> ZoneInfo:
    try:
        return ZoneInfo(s.timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"schedules.{s.name}.timezone: unknown time zone {s.timezone!r}") from exc


def validate(s: Schedule) -> None:
    """Raise ConfigError naming the schedule when its cron expression, zone or window is invalid."""
    _zone(s)
    if not croniter.is_valid(s.cron):
        raise ConfigError(f"schedules.{s.name}.cron: {s.cron!r} is not a valid cron expression")
    if s.window is not None:
        try:
            _window(s.window)
        except ValueError:
            raise ConfigError(f"schedules.{s.name}.window: {s.window!r} is not HH:MM-HH:MM with valid "
                              "times") from None


def _window(text: str) -> tuple[time, time]:
    first, last = (time.fromisoformat(part) for part in text.split("-"))
    return first, last


def next_run(s: Schedule, after: float) -> float:
    """The first firing time strictly after ``after`` (epoch seconds), in the schedule's zone."""
    start = datetime.fromtimestamp(after, _zone(s))
    return float(croniter(s.cron, start).get_next(float))


def in_window(s: Schedule, at: float) -> bool:
    """True when there is no window, or ``at`` falls inside it (windows may wrap midnight)."""
    if s.window is None:
        return True
    first, last = _window(s.window)
    now = datetime.fromtimestamp(at, _zone(s)).time()
    return first <= now <= last if first <= last else (now >= first or now <= last)


def due(next_runs: Mapping[str, float], now: float) -> list[tuple[str, float]]:
    """The schedules whose next run has come by ``now``, earliest first, with their due time."""
    return sorted(((n, at) for n, at in next_runs.items() if at <= now), key=lambda item: (item[1], item[0]))


def first_runs(schedules: Mapping[str, Schedule], now: float) -> dict[str, float]:
    """Each schedule's first firing time after ``now`` (the agent's start)."""
    return {name: next_run(s, now) for name, s in schedules.items()}


def after_firing(s: Schedule, due_at: float, now: float) -> float:
    """The next run after one that was due at ``due_at`` and handled at ``now``: missed runs in
    between (the agent was down or busy) collapse into the one just handled."""
    return next_run(s, max(now, due_at))
