"""core/demand.py: what the box does next for the requests the proxy holds, on a fake clock."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path

from orchestrator.core.demand import (
    Box,
    Kind,
    ModelView,
    admit,
    conflicts_of,
    decide,
    expired,
    idle,
    recorded_swaps,
    retry_after,
)
from orchestrator.core.resident import State

from .test_catalog_demand import load

A_B_SHARE = {"a": frozenset({"b"}), "b": frozenset({"a"})}


def box(*views: ModelView, **kw: object) -> Box:
    fields: dict[str, object] = {"conflicts": A_B_SHARE, **kw}
    return Box(models={v.name: v for v in views}, **fields)  # type: ignore[arg-type]


def serving(name: str, **kw: object) -> ModelView:
    return ModelView(name=name, state=State.SERVING, since=0.0, **kw)  # type: ignore[arg-type]


def asleep(name: str, **kw: object) -> ModelView:
    return ModelView(name=name, state=State.ASLEEP, sleeps=True, since=0.0, **kw)  # type: ignore[arg-type]


def stopped(name: str, **kw: object) -> ModelView:
    return ModelView(name=name, state=State.STOPPED, **kw)  # type: ignore[arg-type]


def test_nothing_held_means_nothing_to_do() -> None:
    """No request waits: NONE."""
    assert decide(box(serving("a"), asleep("b")), 100.0).kind is Kind.NONE


def test_a_request_for_a_sleeper_on_free_gpus_wakes_it_at_once() -> None:
    """Its GPUs are free: wake now, nothing displaced, no swap counted."""
    action = decide(box(asleep("b", waiting=(99.0,)), conflicts={}), 100.0)
    assert (action.kind, action.model, action.displaces, action.swap) == (Kind.WAKE, "b", (), False)


def test_a_request_for_a_stopped_model_starts_it() -> None:
    """Stopped: a cold start."""
    assert decide(box(stopped("b", waiting=(99.0,)), conflicts={}), 100.0).kind is Kind.START


def test_an_idle_awake_model_gives_way_at_once() -> None:
    """The displaced model has no request in flight or held: the swap happens now and counts."""
    action = decide(box(serving("a"), asleep("b", waiting=(99.0,))), 100.0)
    assert (action.kind, action.model, action.displaces, action.swap) == (Kind.WAKE, "b", ("a",), True)


def test_the_awake_models_requests_go_first_then_the_batch_swaps() -> None:
    """a still serves: b's requests wait until the oldest has waited batch_wait_s, then b wakes."""
    b = box(serving("a", in_flight=2), asleep("b", waiting=(100.0, 100.5)), batch_wait_s=2.0)
    held = decide(b, 101.0)
    assert (held.kind, held.model, held.until) == (Kind.WAIT, "b", 102.0)
    assert "batch_wait_s" in held.reason
    assert decide(b, 102.0).kind is Kind.WAKE


def test_min_awake_protects_a_model_that_just_came_up() -> None:
    """a came up at 100 with min_awake_s 30: no swap before 130, even when it is idle."""
    b = box(replace(serving("a", min_awake_s=30.0), since=100.0), asleep("b", waiting=(105.0,)))
    held = decide(b, 110.0)
    assert (held.kind, held.until) == (Kind.WAIT, 130.0) and "min_awake_s" in held.reason
    assert decide(b, 130.0).kind is Kind.WAKE


def test_the_swap_cap_holds_swaps_until_the_window_frees_one() -> None:
    """3 swaps in the last minute with a cap of 3: wait until the oldest leaves the window."""
    b = box(serving("a"), asleep("b", waiting=(99.0,)), swaps=(50.0, 70.0, 90.0), max_swaps_per_min=3)
    held = decide(b, 100.0)
    assert (held.kind, held.until) == (Kind.WAIT, 110.0) and "max_swaps_per_min" in held.reason
    assert decide(b, 110.5).kind is Kind.WAKE


def test_a_swap_waits_a_share_of_the_minute_after_the_last_one() -> None:
    """Cap 6: the next swap comes 10 s after the last, not at once (a burst would use up the minute)."""
    b = box(serving("a"), asleep("b", waiting=(99.0,)), swaps=(95.0,))
    held = decide(b, 100.0)
    assert (held.kind, held.until) == (Kind.WAIT, 105.0) and "spread 10 s apart" in held.reason
    assert decide(b, 105.0).kind is Kind.WAKE


def test_two_models_asked_in_turn_swap_evenly_through_the_minute() -> None:
    """a and b each asked as soon as the other serves, for two minutes (cap 6): swaps come 10 s apart,
    never 6 in a burst and then none for the rest of the minute."""
    swaps: list[float] = []
    up, down = "a", "b"
    t = 100.0
    while t < 220.0:
        action = decide(box(serving(up), asleep(down, waiting=(t,)), swaps=tuple(swaps), batch_wait_s=0.0), t)
        if action.kind is Kind.WAKE:
            swaps.append(t)
            up, down = down, up
        t += 0.5
    gaps = [later - earlier for earlier, later in pairwise(swaps)]
    assert len(swaps) == 12 and set(gaps) == {10.0}


def test_recorded_swaps_become_monotonic_times_of_the_last_minute() -> None:
    """Wall-clock records 100 s, 50 s ago and 0.5 s ahead (a clock stepped back), read at monotonic 70:
    the first is out of the window, the last is now."""
    assert recorded_swaps([1000.0, 1050.0, 1100.5], epoch=1100.0, now=70.0) == (20.0, 70.0)


def test_swaps_older_than_a_minute_do_not_count() -> None:
    """Swaps 61 s ago are out of the window."""
    assert decide(box(serving("a"), asleep("b", waiting=(99.0,)), swaps=(39.0,) * 6), 100.0).kind is Kind.WAKE


def test_an_operators_operation_holds_precedence() -> None:
    """An operator's switch (or bench, tune) holds the box: on-demand waits, naming it."""
    held = decide(box(serving("a"), asleep("b", waiting=(99.0,)), busy="switch c by alice"), 100.0)
    assert held.kind is Kind.WAIT and held.until is None and "switch c by alice" in held.reason


def test_one_swap_at_a_time() -> None:
    """While b comes up nothing else starts."""
    held = decide(box(stopped("a", waiting=(99.0,)), stopped("b"), running="b", conflicts={}), 100.0)
    assert (held.kind, held.model) == (Kind.WAIT, "b")


def test_the_higher_priority_goes_first() -> None:
    """b (priority 5, 1 waiting) before c (priority 0, 4 waiting)."""
    b = box(asleep("b", priority=5, waiting=(99.0,)), asleep("c", waiting=(90.0,) * 4), conflicts={})
    assert decide(b, 100.0).model == "b"


def test_with_equal_priority_the_most_asked_goes_first() -> None:
    """The model with more held requests wins: the box ends serving what is asked most."""
    b = box(asleep("b", waiting=(99.0,)), asleep("c", waiting=(99.5, 99.6)), conflicts={})
    assert decide(b, 100.0).model == "c"


def test_a_busy_model_of_higher_priority_is_not_swapped_out() -> None:
    """a (priority 9) has requests in flight: b (priority 0) waits for it to go idle, past the batch bound."""
    held = decide(box(serving("a", priority=9, in_flight=1), asleep("b", waiting=(10.0,))), 100.0)
    assert held.kind is Kind.WAIT and held.until is None and "priority 9" in held.reason


def test_a_model_on_free_gpus_is_not_held_back_by_one_that_waits() -> None:
    """c (top priority) waits for min_awake_s; d, on free GPUs, starts meanwhile."""
    conflicts = {"a": frozenset({"c"}), "c": frozenset({"a"})}
    b = box(
        replace(serving("a", min_awake_s=60.0), since=90.0),
        asleep("c", priority=5, waiting=(99.0,)),
        stopped("d", waiting=(99.5,)),
        conflicts=conflicts,
    )
    action = decide(b, 100.0)
    assert (action.kind, action.model) == (Kind.START, "d")


def test_beyond_the_queue_limit_a_request_gets_429_with_retry_after() -> None:
    """queue_limit 2 with 2 held: the third is 429 with Retry-After counting the cap and the batch bound."""
    b = box(serving("a"), asleep("b", queue_limit=2, waiting=(99.0, 99.5)), swaps=(50.0,) * 6, batch_wait_s=2.0)
    reject = admit(b, "b", 100.0)
    assert reject is not None and (reject.status, reject.retry_after_s) == (429, 12)
    assert "queue_limit 2" in reject.message
    assert admit(b, "a", 100.0) is None


def test_retry_after_is_at_least_one_second() -> None:
    """No cap reached, no batching: Retry-After 1."""
    assert retry_after(box(serving("a"), batch_wait_s=0.0), "a", 100.0) == 1


def test_a_model_not_on_demand_is_never_brought_up() -> None:
    """A stopped model without on_demand: 503 naming the switch that brings it up."""
    reject = admit(box(stopped("c", on_demand=False)), "c", 100.0)
    assert reject is not None and reject.status == 503 and "orchestrator switch c" in reject.message


def test_a_deadline_passed_while_the_policy_held_back_is_429() -> None:
    """Held back by the cap until past its deadline: 429 with Retry-After, the reason named."""
    b = box(serving("a"), asleep("b", waiting=(70.0,)), swaps=(50.0,) * 6)
    reject = expired(b, "b", 100.0, 30.0)
    assert (reject.status, reject.retry_after_s) == (429, 12) and "max_swaps_per_min" in reject.message


def test_a_deadline_passed_while_the_model_came_up_is_503() -> None:
    """The engine itself was too slow: 503."""
    reject = expired(box(stopped("b", waiting=(70.0,)), running="b"), "b", 100.0, 30.0)
    assert reject.status == 503 and "not ready within 30 s" in reject.message


def test_an_idle_model_sleeps_after_idle_sleep_s() -> None:
    """Last request at 100, idle_sleep_s 60: due at 160, slept at 160."""
    b = box(serving("a", idle_sleep_s=60.0, sleeps=True, last_request=100.0))
    assert idle(b, 150.0) == (idle(b, 150.0)[0], 160.0) and idle(b, 150.0)[0].kind is Kind.NONE
    action, _ = idle(b, 160.0)
    assert (action.kind, action.model) == (Kind.SLEEP, "a") and "idle_sleep_s 60" in action.reason


def test_a_sleeper_stops_after_idle_stop_s() -> None:
    """Asleep, last request at 100, idle_stop_s 600: stopped at 700."""
    b = box(asleep("a", idle_sleep_s=60.0, idle_stop_s=600.0, last_request=100.0))
    assert idle(b, 699.0)[1] == 700.0
    assert idle(b, 700.0)[0].kind is Kind.STOP


def test_a_sleeper_stops_idle_stop_s_after_its_last_request_not_after_it_fell_asleep() -> None:
    """Last request at 100, asleep since 160 (idle_sleep_s 60), idle_stop_s 600: stopped at 700, not 760."""
    b = box(replace(asleep("a", idle_sleep_s=60.0, idle_stop_s=600.0, last_request=100.0), since=160.0))
    assert idle(b, 650.0)[1] == 700.0
    assert idle(b, 700.0)[0].kind is Kind.STOP


def test_a_model_without_sleep_mode_stops_when_idle() -> None:
    """No sleep mode, idle_stop_s 120: stopped."""
    assert idle(box(serving("a", idle_stop_s=120.0, last_request=0.0)), 120.0)[0].kind is Kind.STOP


def test_a_model_with_requests_in_flight_or_held_is_not_idle() -> None:
    """In flight or held: not idle, whatever the last request's time."""
    assert idle(box(serving("a", idle_stop_s=1.0, in_flight=1, last_request=0.0)), 100.0)[0].kind is Kind.NONE
    assert idle(box(serving("a", idle_stop_s=1.0, waiting=(99.0,), last_request=0.0)), 100.0)[0].kind is Kind.NONE


def test_idle_counts_from_when_it_came_up_when_that_is_later() -> None:
    """Woken at 500 by an operator, last request at 100: idle from 500."""
    b = box(replace(serving("a", idle_stop_s=60.0, last_request=100.0), since=500.0))
    assert idle(b, 530.0) == (idle(b, 530.0)[0], 560.0)


def test_idle_sleep_waits_for_min_awake() -> None:
    """Came up at 100 with min_awake_s 300 and idle_sleep_s 10: not asleep before 400."""
    b = box(replace(serving("a", idle_sleep_s=10.0, sleeps=True, min_awake_s=300.0), since=100.0))
    assert idle(b, 200.0)[1] == 400.0


def test_nothing_goes_idle_while_an_operator_holds_the_box() -> None:
    """Due, but busy: NONE now, due again at once."""
    action, due = idle(box(serving("a", idle_stop_s=1.0, last_request=0.0), busy="tune"), 100.0)
    assert (action.kind, due) == (Kind.NONE, 100.0)


def test_models_not_on_demand_never_go_idle() -> None:
    """An operator's model keeps serving."""
    assert idle(box(serving("a", on_demand=False, idle_stop_s=1.0, last_request=0.0)), 100.0) == (
        idle(box(), 100.0)[0],
        None,
    )


def test_models_on_overlapping_gpus_conflict_and_disjoint_ones_do_not(tmp_path: Path) -> None:
    """a and b share GPU 0; c on GPU 1 stays awake beside either."""
    cat = load(tmp_path, rest='[models.c]\nrepo = "org/c"\ngpus = [1]\nport = 8003\non_demand = true')
    assert conflicts_of(cat, "box") == {"a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset()}


def test_a_model_asked_clearly_more_keeps_its_gpus() -> None:
    """a has 4 requests in flight, b 1 held: b waits (no batching bound), and a second b is 429 at once."""
    b = box(serving("a", in_flight=4), asleep("b", waiting=(99.0,)))
    held = decide(b, 200.0)
    assert (held.kind, held.until) == (Kind.WAIT, None) and "a is asked more (4 requests" in held.reason
    reject = admit(b, "b", 200.0)
    assert reject is not None and reject.status == 429 and (reject.retry_after_s or 0) >= 10


def test_a_model_asked_one_or_two_more_does_not_outweigh() -> None:
    """Two clients alternating: both just routed to a (2 in flight), the first asks b: held, not 429."""
    b = box(serving("a", in_flight=2), asleep("b"))
    assert admit(b, "b", 100.0) is None
    assert admit(box(serving("a", in_flight=3), asleep("b", waiting=(99.0,))), "b", 100.0) is None


def test_models_asked_as_much_take_turns() -> None:
    """One in flight for a, one held for b (two clients alternating): b's batch swaps after batch_wait_s."""
    b = box(serving("a", in_flight=1), asleep("b", waiting=(100.0,)), batch_wait_s=1.0)
    assert admit(b, "b", 100.5) is None and decide(b, 100.5).kind is Kind.WAIT
    assert decide(b, 101.0).kind is Kind.WAKE


def test_a_higher_priority_is_never_outweighed_by_demand() -> None:
    """b (priority 1) is held, not refused, and wakes after the batching bound though a has 5 in flight."""
    b = box(serving("a", in_flight=5), asleep("b", priority=1, waiting=(99.0,)))
    assert admit(b, "b", 100.0) is None and decide(b, 101.0).kind is Kind.WAKE


def test_a_displaced_model_serving_nothing_now_gives_way_without_the_batching_bound() -> None:
    """A lone client alternating a and b: a served it a moment ago (peak 1) but a reading since b's
    request came counts nothing in flight: b wakes at once."""
    action = decide(box(serving("a", in_flight=1, current=0), asleep("b", waiting=(100.0,)), batch_wait_s=1.0), 100.0)
    assert (action.kind, action.model, action.displaces) == (Kind.WAKE, "b", ("a",))


def test_a_displaced_model_serving_a_request_now_batches_the_next() -> None:
    """The reading since b's request came counts one in flight for a: b waits, at most batch_wait_s."""
    b = box(serving("a", in_flight=1, current=1), asleep("b", waiting=(100.0,)), batch_wait_s=1.0)
    held = decide(b, 100.2)
    assert (held.kind, held.until) == (Kind.WAIT, 101.0) and "batch_wait_s" in held.reason
    assert decide(b, 101.0).kind is Kind.WAKE


def test_without_a_reading_since_the_request_came_the_recent_peak_batches() -> None:
    """No reading of HAProxy since b's request came (current None): a's recent peak counts as serving."""
    held = decide(box(serving("a", in_flight=1), asleep("b", waiting=(100.0,)), batch_wait_s=1.0), 100.2)
    assert held.kind is Kind.WAIT and "batch_wait_s" in held.reason


def test_a_model_asked_clearly_more_of_late_keeps_its_gpus_though_a_reading_finds_none_in_flight() -> None:
    """Four closed-loop clients of a, read in their gap between requests (current 0): a still keeps its
    GPUs against one request for b (the recent peak decides who is asked more)."""
    held = decide(box(serving("a", in_flight=4, current=0), asleep("b", waiting=(99.0,))), 100.0)
    assert held.kind is Kind.WAIT and "a is asked more" in held.reason
