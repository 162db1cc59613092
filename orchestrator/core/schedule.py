"""When schedules fire (pure: times in, decisions out; croniter does the cron arithmetic).

The parsers here are used twice: by the catalog, so that a bad cron, window or zone is refused
when deploy.toml is loaded, and by the agent's loop, which therefore never meets one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, time
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.core.catalog import Schedule

_WINDOW_RE = re.compile(r"^([0-9]{2}):([0-9]{2})-([0-9]{2}):([0-9]{2})$", re.ASCII)  # \d would take '٠١'
# One cron field: ASCII digits, names (jan, mon) and * , - / (croniter also reads seconds and years
# as a 6th and 7th field, and Unicode digits; the README promises the classic 5 fields).
_CRON_FIELD_RE = re.compile(r"^[0-9A-Za-z*,/-]+$", re.ASCII)
# A cron that never fires from here on (Feb 31) is refused as well as a malformed one.
_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)


def parse_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ValueError naming it when unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as 'UTC' or 'Europe/Berlin')") from exc


def check_fields(expr: str) -> None:
    """Exactly 5 fields of ASCII cron characters; ValueError naming the expression otherwise."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"{expr[:80]!r} is not a valid cron expression: it has {len(fields)} fields, a cron "
                         "expression has exactly 5: minute hour day month weekday (e.g. '0 3 * * *')")
    bad = next((f for f in fields if not _CRON_FIELD_RE.match(f)), None)
    if bad is not None:
        raise ValueError(f"{expr!r}: field {bad!r} may hold only ASCII digits, names (jan, mon) and * , - /")


def check_cron(expr: str) -> str:
    """``expr`` when it is a cron expression that fires; ValueError naming it otherwise."""
    check_fields(expr)
    if not croniter.is_valid(expr):
        raise ValueError(f"{expr!r} is not a valid cron expression (5 fields: minute hour day month weekday)")
    try:
        croniter(expr, _REFERENCE).get_next(float)
    except CroniterError as exc:
        raise ValueError(f"cron expression {expr!r} never fires") from exc
    return expr


def parse_window(text: str) -> tuple[time, time]:
    """``"HH:MM-HH:MM"`` as (first, last); ValueError naming the text when a time is out of range."""
    m = _WINDOW_RE.match(text)
    if m is None:
        raise ValueError(f"window {text!r} must look like 'HH:MM-HH:MM', e.g. '01:00-05:00'")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise ValueError(f"window {text!r} has a time out of range (hours 00-23, minutes 00-59)")
    return time(h1, m1), time(h2, m2)


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
    for key, check in (("timezone", lambda: parse_zone(s.timezone)), ("cron", lambda: check_cron(s.cron)),
                       ("window", lambda: s.window is None or parse_window(s.window))):
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
            raise ConfigError(f"cron expression {s.cron!r} has no fire time after {when} (every time it "
                              "names is in the past); remove the schedule or fix it", key=f"schedules.{name}.cron")
        runs[name] = at
    return runs


def after_firing(s: Schedule, due_at: float, now: float) -> float | None:
    """The next run after one that was due at ``due_at`` and handled at ``now``: missed runs in
    between (the agent was down or busy) collapse into the one just handled. None: it was the last."""
    return next_run(s, max(now, due_at))
