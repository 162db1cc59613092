"""When schedules fire (pure: times in, decisions out; croniter does the cron arithmetic).

The cron, window and zone parsers are field rules (core.catalog_rules): the catalog refuses a bad
one when deploy.toml is loaded, so the agent's loop here never meets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from croniter import CroniterError, croniter

from orchestrator.core.catalog_rules import check_cron, parse_window, parse_zone
from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.core.catalog_policies import Schedule


def window_contains(window: str, zone: str, at: datetime) -> bool:
    """True when ``at`` (an aware datetime) falls inside ``window`` in ``zone``; windows may wrap midnight.

    Both ends are inclusive to the minute: "01:00-05:00" still admits 05:00:59.
    """
    first, last = parse_window(window)
    now = at.astimezone(parse_zone(zone)).time().replace(second=0, microsecond=0)
    return first <= now <= last if first <= last else (now >= first or now <= last)


def validate(s: Schedule) -> None:
    """Raise ConfigError naming the key when the schedule's cron, window or zone is invalid.

    The catalog already refuses such a schedule at load time; this guards one built in code.
    """
    for key, check in (
        ("timezone", lambda: parse_zone(s.timezone)),
        ("cron", lambda: check_cron(s.cron)),
        ("window", lambda: s.window is None or parse_window(s.window)),
    ):
        try:
            check()
        except ValueError as exc:
            raise ConfigError(f"schedules.{s.name}.{key}: {exc}") from exc


def next_run(s: Schedule, after: float) -> float | None:
    """The first firing time strictly after ``after`` (epoch seconds), in the schedule's zone; None
    when there is none (a cron with a year field, ``0 0 1 1 * 0 2027``, ends)."""
    start = datetime.fromtimestamp(after, parse_zone(s.timezone))
    try:
        return float(croniter(s.cron, start).get_next(float))
    except CroniterError:  # croniter's "failed to find next date"
        return None


# How many firings past the next one to look through for one inside the window: a minutely cron
# reaches a window 23 hours away; a cron that keeps missing its window this long never meets it.
_WINDOW_SEARCH = 5000


def next_run_in_window(s: Schedule, first: float) -> float | None:
    """The first firing at or after ``first`` (a firing time) that the window admits, i.e. the one
    that will act (the agent skips the others); None when none of the next firings falls inside."""
    if in_window(s, first):
        return first
    it = croniter(s.cron, datetime.fromtimestamp(first, parse_zone(s.timezone)))
    for _ in range(_WINDOW_SEARCH):
        at = float(it.get_next(float))
        if in_window(s, at):
            return at
    return None


def in_window(s: Schedule, at: float) -> bool:
    """True when there is no window, or ``at`` (epoch seconds) falls inside it."""
    if s.window is None:
        return True
    return window_contains(s.window, s.timezone, datetime.fromtimestamp(at, UTC))


def due(next_runs: Mapping[str, float], now: float) -> list[tuple[str, float]]:
    """The schedules whose next run has come by ``now``, earliest first, with their due time."""
    return sorted(((n, at) for n, at in next_runs.items() if at <= now), key=lambda item: (item[1], item[0]))


def first_runs(schedules: Mapping[str, Schedule], now: float) -> dict[str, float]:
    """Each schedule's first firing time after ``now`` (the agent's start, or a push). ConfigError
    naming the schedule and its cron when one has none: it would never run again."""
    runs: dict[str, float] = {}
    for name, s in schedules.items():
        at = next_run(s, now)
        if at is None:
            when = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M UTC")
            raise ConfigError(
                f"cron expression {s.cron!r} has no fire time after {when} (every time it "
                "names is in the past); remove the schedule or fix it",
                key=f"schedules.{name}.cron",
            )
        runs[name] = at
    return runs


def after_firing(s: Schedule, due_at: float, now: float) -> float | None:
    """The next run after one that was due at ``due_at`` and handled at ``now``: missed runs in
    between (the agent was down or busy) collapse into the one just handled. None: it was the last."""
    return next_run(s, max(now, due_at))
