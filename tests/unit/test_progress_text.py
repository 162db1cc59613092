"""Progress lines say what the switch really does: no route without a proxy, no stop in a handover."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from orchestrator.cli.progress import ProgressPrinter

from .conftest import World
from .test_proxy_engine import ProxyWorld


def printed(events: list[tuple[str, dict[str, Any]]]) -> str:
    out = io.StringIO()
    printer = ProgressPrinter(Console(file=out, width=200, soft_wrap=True))
    for event, fields in events:
        printer(event, fields)
    return out.getvalue()


def test_without_a_proxy_no_line_speaks_of_routing(world: World) -> None:
    """A stop-start switch on a host without the front proxy prints no routing phase."""
    world.switch("alpha")
    world.switch("beta")
    text = printed(world.events)
    assert "#2 beta: stopping the old unit" in text
    assert "rout" not in text and "proxy" not in text


def test_a_handover_does_not_say_it_stops_the_old_unit_before_the_route_moves() -> None:
    """chat-a -> chat-b (disjoint GPUs): stopping says nothing stops yet; routing says it drains and stops."""
    pw = ProxyWorld()
    pw.switch("chat-a")
    pw.events.clear()
    pw.switch("chat-b")
    text = printed(pw.events)
    assert "stopping the old unit" not in text
    assert "#2 chat-b: stopping: nothing yet (a handover: the old engine serves until the route moves)" in text
    assert "#2 chat-b: routing: the front proxy moves the route, drains and stops the old engine" in text


def test_a_rollback_with_the_proxy_names_the_set_it_restores() -> None:
    """The proxy's rollback event (a serving set, no single revision) prints the set instead of failing."""
    assert "rolling back to the serving set before: chat-a, code" in printed(
        [("rollback", {"revision": 3, "to_set": ["chat-a", "code"]})]
    )


def test_a_warm_switch_says_who_sleeps_and_who_woke() -> None:
    """alpha -> beta -> alpha with sleep mode: the lines name the sleeper, its level and the woken model."""
    from .test_warm_switch import WarmWorld

    ww = WarmWorld()
    ww.switch("alpha")
    ww.switch("beta")
    ww.events.clear()
    ww.switch("alpha")
    text = printed(ww.events)
    assert "#3 alpha: waking: wake_up, then one real completion within wake_deadline_s" in text
    assert "beta sleeps (level1, " in text and "alpha woke and answered a completion (" in text
