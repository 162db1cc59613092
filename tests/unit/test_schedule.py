"""Schedule rules as pure functions on fixed datetimes: windows, cron and zones, checked at load time."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from orchestrator.core import schedule
from orchestrator.core.catalog import Catalog, Schedule

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    "hhmm,inside",
    [
        ("00:59", False),
        ("01:00", True),
        ("03:30", True),
        ("05:00", True),
        ("05:00:59", True),
        ("05:01", False),
        ("23:00", False),
    ],
)
def test_window_inside_and_outside(hhmm: str, inside: bool) -> None:
    """'01:00-05:00' admits 01:00 through 05:00 (both ends, to the minute) and nothing else."""
    at = datetime.fromisoformat(f"2026-03-10T{hhmm}").replace(tzinfo=UTC)
    assert schedule.window_contains("01:00-05:00", "UTC", at) is inside


@pytest.mark.parametrize(
    "hhmm,inside",
    [
        ("21:59", False),
        ("22:00", True),
        ("23:59", True),
        ("00:00", True),
        ("02:00", True),
        ("02:01", False),
        ("12:00", False),
    ],
)
def test_window_across_midnight(hhmm: str, inside: bool) -> None:
    """'22:00-02:00' wraps midnight: late evening and early morning are inside, midday is not."""
    at = datetime.fromisoformat(f"2026-03-10T{hhmm}").replace(tzinfo=UTC)
    assert schedule.window_contains("22:00-02:00", "UTC", at) is inside


@pytest.mark.parametrize(
    "utc,inside",
    [
        ("2026-01-15T00:30", True),  # 01:30 in Berlin (CET, UTC+1)
        ("2026-01-15T04:30", False),  # 05:30 in Berlin
        ("2026-07-15T23:30", True),  # 01:30 next day in Berlin (CEST, UTC+2)
        ("2026-07-15T03:30", False),  # 05:30 in Berlin
    ],
)
def test_window_is_read_in_the_schedule_zone(utc: str, inside: bool) -> None:
    """A window is local time of the schedule's zone, across daylight saving time."""
    at = datetime.fromisoformat(utc).replace(tzinfo=UTC)
    assert schedule.window_contains("01:00-05:00", "Europe/Berlin", at) is inside


def test_in_window_takes_epoch_seconds_in_the_schedule_zone() -> None:
    """in_window(schedule, epoch) agrees with the zone: 02:00 in Berlin is 01:00 UTC in winter."""
    s = Schedule(name="n", cron="0 2 * * *", action="redeploy", window="01:30-02:30", timezone="Europe/Berlin")
    assert schedule.in_window(s, datetime(2026, 1, 15, 2, 0, tzinfo=BERLIN).timestamp())
    assert not schedule.in_window(s, datetime(2026, 1, 15, 2, 0, tzinfo=UTC).timestamp())


def test_next_run_is_computed_in_the_schedule_zone() -> None:
    """'0 3 * * *' in Berlin fires at 03:00 Berlin time, i.e. 02:00 UTC in winter."""
    s = Schedule(name="n", cron="0 3 * * *", action="redeploy", timezone="Europe/Berlin")
    after = datetime(2026, 1, 15, 12, 0, tzinfo=UTC).timestamp()
    assert schedule.next_run(s, after) == datetime(2026, 1, 16, 2, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("window", "25:99-99:00", "window '25:99-99:00' has a time out of range"),
        ("window", "1:00-2:00", "must look like 'HH:MM-HH:MM'"),
        ("window", "01:00-24:00", "out of range"),
        ("cron", "not a cron", "'not a cron' is not a valid cron expression"),
        ("cron", "0 0 31 2 *", "never fires"),
        ("cron", "61 * * * *", "is not a valid cron expression"),
        ("timezone", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("timezone", "../../etc/passwd", "unknown time zone"),
    ],
)
def test_invalid_schedule_is_refused_at_load_time(field: str, value: str, message: str) -> None:
    """A bad cron, window or zone is refused when the catalog is built, not when the agent fires it."""
    data = {
        "hosts": {"h": {"gpus": 1}},
        "models": {"m": {"repo": "o/m", "gpus": [0]}},
        "schedules": {"s": {"cron": "0 3 * * *", "model": "m", field: value}},
    }
    with pytest.raises(ValidationError, match=message):
        Catalog.model_validate(data)


def test_next_run_shown_is_the_first_one_its_window_admits() -> None:
    """'0 * * * *' with window 01:00-02:00, asked at 12:30 UTC: the next run that acts is 01:00 next day."""
    s = Schedule(name="n", cron="0 * * * *", action="redeploy", window="01:00-02:00", timezone="UTC")
    first = schedule.next_run(s, datetime(2026, 1, 15, 12, 30, tzinfo=UTC).timestamp())
    assert schedule.next_run_in_window(s, first) == datetime(2026, 1, 16, 1, 0, tzinfo=UTC).timestamp()


def test_a_cron_that_never_meets_its_window_has_no_next_run() -> None:
    """'0 6 * * *' with window 01:00-05:00 never runs: no next run instead of a time it will skip."""
    s = Schedule(name="n", cron="0 6 * * *", action="redeploy", window="01:00-05:00", timezone="UTC")
    assert schedule.next_run_in_window(s, schedule.next_run(s, datetime(2026, 1, 15, tzinfo=UTC).timestamp())) is None
