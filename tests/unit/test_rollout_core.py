"""The rollout's pure decisions: plan, next step after each batch, resume after a controller crash, gate."""

from __future__ import annotations

import pytest

from orchestrator.core.rollout import (
    Decision,
    HostRecord,
    HostState,
    Observed,
    Policy,
    decide,
    gate_failure,
    plan,
    resume_action,
    state_of_outcome,
)
from orchestrator.errors import UsageError

HOSTS = ["h1", "h2", "h3", "h4", "h5"]
S = HostState


def records(states: dict[str, HostState], batches: list[tuple[str, ...]]) -> list[HostRecord]:
    return [HostRecord(host=h, batch=i, state=states.get(h, S.PENDING)) for i, b in enumerate(batches) for h in b]


def test_plan_canary_alone_then_batches() -> None:
    """Canary 1, batch 2 over five hosts: [h1], [h2, h3], [h4, h5]."""
    assert plan(HOSTS, 1, 2) == [("h1",), ("h2", "h3"), ("h4", "h5")]


def test_plan_without_canary_and_uneven_last_batch() -> None:
    """Canary 0, batch 3: [h1..h3], [h4, h5]."""
    assert plan(HOSTS, 0, 3) == [("h1", "h2", "h3"), ("h4", "h5")]


@pytest.mark.parametrize(
    ("canary", "batch", "words"), [(5, 1, "covers all 5 hosts"), (-1, 1, "canary must"), (1, 0, "batch >= 1")]
)
def test_plan_refuses_bad_sizes(canary: int, batch: int, words: str) -> None:
    """A canary covering every host, or sizes below their minimum, are bad input naming the values."""
    with pytest.raises(UsageError, match=words):
        plan(HOSTS, canary, batch)


def test_first_decision_switches_the_canary_only() -> None:
    """Nothing done yet: switch batch 0 (the canary), nothing else."""
    batches = plan(HOSTS, 1, 2)
    assert decide(records({}, batches), Policy(), has_canary=True) == Decision("switch", batch=0, hosts=("h1",))


def test_after_the_canary_the_next_batch_goes() -> None:
    """Canary switched and staged hosts waiting: the next batch is h2, h3."""
    batches = plan(HOSTS, 1, 2)
    recs = records({"h1": S.SWITCHED, "h2": S.STAGED, "h3": S.STAGED}, batches)
    assert decide(recs, Policy(), has_canary=True) == Decision("switch", batch=1, hosts=("h2", "h3"))


def test_failed_canary_stops_even_within_max_failures() -> None:
    """A failed canary stops the rollout whatever max_failures allows; nothing else is switched."""
    recs = records({"h1": S.FAILED}, plan(HOSTS, 1, 2))
    got = decide(recs, Policy(max_failures=3), has_canary=True)
    assert got.kind == "stop" and got.revert == () and "canary h1" in got.reason


def test_failure_beyond_budget_stops_and_keeps_switched_hosts_by_default() -> None:
    """A failure in batch 2 with max_failures 0: stop; the switched canary stays switched."""
    recs = records({"h1": S.SWITCHED, "h2": S.SWITCHED, "h3": S.FAILED}, plan(HOSTS, 1, 2))
    got = decide(recs, Policy(), has_canary=True)
    assert got.kind == "stop" and got.revert == () and "h3" in got.reason


def test_rollback_all_reverts_every_switched_host() -> None:
    """--rollback-all: stopping returns the switched hosts as well (not the failed one: its agent did)."""
    recs = records({"h1": S.SWITCHED, "h2": S.SWITCHED, "h3": S.FAILED}, plan(HOSTS, 1, 2))
    assert decide(recs, Policy(rollback_all=True), has_canary=True).revert == ("h1", "h2")


def test_failures_within_budget_continue() -> None:
    """max_failures 1: one failed host in batch 2 and the rollout goes on to batch 3."""
    recs = records({"h1": S.SWITCHED, "h2": S.SWITCHED, "h3": S.FAILED}, plan(HOSTS, 1, 2))
    assert decide(recs, Policy(max_failures=1), has_canary=True) == Decision("switch", batch=2, hosts=("h4", "h5"))


def test_in_flight_switches_are_waited_for_first() -> None:
    """A host still switching (e.g. after a restart): wait for it before any new decision."""
    recs = records({"h1": S.SWITCHED, "h2": S.SWITCHING, "h3": S.FAILED}, plan(HOSTS, 1, 2))
    assert decide(recs, Policy(), has_canary=True) == Decision(
        "wait", hosts=("h2",), reason="switches still running on their agents"
    )


def test_all_switched_is_done() -> None:
    """Every host switched: done."""
    recs = records(dict.fromkeys(HOSTS, S.SWITCHED), plan(HOSTS, 1, 2))
    assert decide(recs, Policy(), has_canary=True).kind == "done"


def test_abort_stops_before_the_next_batch() -> None:
    """An aborted rollout stops; with --rollback-all it reverts the switched hosts."""
    recs = records({"h1": S.SWITCHED}, plan(HOSTS, 1, 2))
    got = decide(recs, Policy(rollback_all=True), has_canary=True, aborted=True)
    assert (got.kind, got.revert) == ("stop", ("h1",))


def test_an_abort_reason_names_what_was_left_undone() -> None:
    """The reason of an abort is not "aborted" again (shown as "aborted: aborted"): it names the hosts
    the abort kept from being switched."""
    recs = records({"h1": S.SWITCHED}, plan(HOSTS, 1, 2))
    reason = decide(recs, Policy(), has_canary=True, aborted=True).reason
    assert reason == f"abort requested; not switched: {', '.join(HOSTS[1:])}"


@pytest.mark.parametrize(
    ("state", "observed", "action"),
    [
        (S.SWITCHED, Observed(busy=False, ours="active"), "keep"),
        (S.FAILED, Observed(busy=True, ours=None), "keep"),
        (S.REVERTED, Observed(busy=False, ours="active"), "keep"),
        (S.SWITCHING, Observed(busy=True, ours="starting", ours_ended=False), "follow"),
        (S.SWITCHING, Observed(busy=False, ours="active"), "record"),
        (S.SWITCHING, Observed(busy=False, ours="rolled_back"), "record"),
        (S.SWITCHING, Observed(busy=False, ours="active", serves_ours=False), "superseded"),
        (S.SWITCHING, Observed(busy=False, ours=None), "switch"),
        (S.STAGED, Observed(busy=False, ours=None), "switch"),
    ],
)
def test_resume_never_switches_a_host_twice(state: HostState, observed: Observed, action: str) -> None:
    """Recorded as ended: kept; ended unseen: recorded from its agent, unless the box serves another model
    now (superseded: not switched); only a request that never arrived is sent."""
    assert resume_action(HostRecord("h2", 1, state), observed) == action


def test_outcomes_map_to_host_states() -> None:
    """active/no-op -> switched; rolled_back/aborted/failed -> failed; a running phase is refused."""
    assert [state_of_outcome(o) for o in ("active", "noop", "rolled_back", "aborted", "failed")] == [
        S.SWITCHED,
        S.SWITCHED,
        S.FAILED,
        S.FAILED,
        S.FAILED,
    ]
    with pytest.raises(UsageError, match="'starting' has not ended"):
        state_of_outcome("starting")


def test_gate_health_and_bench() -> None:
    """Gate: the wrong model, an unhealthy one, and a benchmark below the ratio each fail, naming why."""
    assert gate_failure(model="b", serving="b", healthy=True) is None
    assert gate_failure(model="b", serving="a", healthy=True) == "serves a instead of b"
    assert gate_failure(model="b", serving="b", healthy=False) == "b is not healthy"
    slow = gate_failure(model="b", serving="b", healthy=True, tok_s=50.0, previous_tok_s=100.0, min_ratio=0.9)
    assert slow == "50.0 tok/s is below 0.9 x 100.0 tok/s of the previous revision"
    assert gate_failure(model="b", serving="b", healthy=True, tok_s=95.0, previous_tok_s=100.0, min_ratio=0.9) is None
