"""tests/hosts/wait.wait_for: how long it sleeps between probes (a fake clock, no real sleeps)."""

from __future__ import annotations

import pytest

from tests.hosts.wait import wait_for


class Clock:
    """A clock that moves only when a probe 'costs' time or the waiter sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def probe_costing(clock: Clock, cost: float, ready_after: int) -> object:
    calls = []

    def probe() -> bool:
        calls.append(1)
        clock.now += cost
        return len(calls) > ready_after

    return probe


def test_a_cheap_probe_is_repeated_every_interval() -> None:
    """A probe that takes less than the interval is repeated after the interval."""
    clock = Clock()
    assert wait_for(probe_costing(clock, 0.001, 3), interval=0.05, clock=clock, sleep=clock.sleep) is True
    assert clock.sleeps == [0.05, 0.05, 0.05]


def test_a_costly_probe_waits_as_long_as_it_took() -> None:
    """A probe that takes longer than the interval (a CLI started in a host) sleeps as long as it took:
    at most half of the time goes to probing."""
    clock = Clock()
    wait_for(probe_costing(clock, 0.4, 2), interval=0.05, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [pytest.approx(0.4), pytest.approx(0.4)]


def test_the_timeout_names_what_was_awaited_and_the_last_value() -> None:
    """Past the timeout: an AssertionError naming the condition and the last value the probe gave."""
    clock = Clock()
    with pytest.raises(AssertionError, match=r"the unit active not reached within 1 s; last value: 'inactive'"):
        wait_for(
            lambda: "inactive",
            lambda v: v == "active",
            timeout=1,
            what="the unit active",
            clock=clock,
            sleep=clock.sleep,
        )
