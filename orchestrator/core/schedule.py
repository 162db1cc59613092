"""When schedules fire (pure: times in, decisions out; croniter does the cron arithmetic)."""

from __future__ import annotations

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
    """Raise ConfigError naming the schedule when its cron expression or zone is invalid."""
    _zone(s)
    if not croniter.is_valid(s.cron):
        raise ConfigError(f"schedules.{s.name}.cron: {s.cron!r} is not a valid cron expression")


def next_run(s: Schedule, after: float) -> float:
    """The first firing time strictly after ``after`` (epoch seconds), in the schedule's zone."""
    start = datetime.fromtimestamp(after, _zone(s))
    return float(croniter(s.cron, start).get_next(float))


def in_window(s: Schedule, at: float) -> bool:
    """True when there is no window, or ``at`` falls inside it (windows may wrap midnight)."""
    if s.window is None:
        return True
    first, last = (time.fromisoformat(part) for part in s.window.split("-"))
    now = datetime.fromtimestamp(at, _zone(s)).time()
    return first <= now <= last if first <= last else (now >= first or now <= last)
