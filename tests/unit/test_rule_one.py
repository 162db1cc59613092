"""Rule 1 (after h11's ``_state.py``): every fact about phases lives in core/states.py's table, and the
engine only ever moves a deployment the way the table says.

Two kinds of checks: the code's text (no module outside core/states.py compares phase or outcome names,
keeps its own set of phases, or moves a deployment), and its behaviour (conftest's guard holds every
move any unit test's engine makes to the table; here, the guard itself is shown to catch a move the
table does not allow).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from orchestrator.core.states import (
    ABANDONABLE,
    DOWN,
    ENDED,
    EXTRA_EVENTS,
    RAISED_EVENTS,
    TABLE,
    TRANSITIONS,
    Event,
    Fallback,
    Phase,
    advance,
    failed,
    reported,
)
from orchestrator.errors import EngineWedged, StateError, UsageError
from tests.builders.source import parse
from tests.unit.conftest import World, legal_move

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
STATES = PACKAGE / "core" / "states.py"
NAMES = {p.value for p in Phase}
MOVERS = {PACKAGE / "deploy" / "deployer.py"}  # the one module that moves deployments (through advance)


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != STATES:
            yield path, parse(path)


def _about_phases(node: ast.expr) -> bool:
    text = ast.unparse(node).lower()
    return "phase" in text or "outcome" in text


def _phase_names(node: ast.expr) -> list[str]:
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES]


def _phase_members(node: ast.expr) -> int:
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else []
    return sum(
        1
        for i in items
        if isinstance(i, ast.Attribute) and isinstance(i.value, ast.Name) and i.value.id in ("Phase", "P")
    )


def test_no_module_compares_phase_or_outcome_names() -> None:
    """``result["outcome"] != "active"`` reads a phase fact outside the table: compare with Phase members
    (or ask core/states.py), so that renaming or adding a phase is one edit."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = [n for s in sides for n in _phase_names(s)]
            if names and any(_about_phases(s) for s in sides):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_no_module_keeps_its_own_set_of_phases() -> None:
    """Which phases are down, ended or abandonable are states.py's (dashboard.py once kept a DOWN_PHASES
    that missed the warm phases): a literal naming two phases or more elsewhere is a copy."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and _phase_members(node) >= 2:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_only_the_engine_moves_a_deployment() -> None:
    """advance() and the store's transition() are called by deploy/deployer.py alone."""
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and path not in MOVERS:
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("advance", "transition"):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_the_table_is_the_transitions() -> None:
    """TRANSITIONS (one key a phase, event and fallback) is TABLE flattened, and advance reads TABLE."""
    for (phase, event, fallback), there in TRANSITIONS.items():
        assert advance(phase, event, fallback) is there
    assert {p for p, _, _ in TRANSITIONS} == set(TABLE) == set(Phase) - ENDED


def test_the_phase_facts_agree_with_the_table() -> None:
    """Extra events are the table's, raised ones among them; abandonable and down phases are running ones."""
    assert {(p, e) for p, row in TABLE.items() for e in row if e not in (Event.OK, Event.FAIL)} == set(
        EXTRA_EVENTS.items()
    )
    assert all(EXTRA_EVENTS[p] is e for p, (_, e) in RAISED_EVENTS.items())
    assert ABANDONABLE <= DOWN and not DOWN & ENDED


def test_a_step_error_reports_the_tables_event() -> None:
    """A wedged wake reports wedged; the same error elsewhere, or another error in waking, fails."""
    assert failed(Phase.WAKING, EngineWedged("wedged")) is Event.WEDGED
    assert failed(Phase.CHECKING, EngineWedged("wedged")) is Event.FAIL
    assert failed(Phase.WAKING, UsageError("no")) is Event.FAIL


def test_a_step_may_report_only_its_phases_events() -> None:
    assert reported(Phase.STAGING, Event.WARM) is Event.WARM
    with pytest.raises(StateError, match="the 'checking' step reported 'warm'"):
        reported(Phase.CHECKING, Event.WARM)


def test_legal_move_accepts_only_the_tables_moves() -> None:
    assert legal_move(Phase.CHECKING, Phase.ROLLING_BACK, Fallback.PREVIOUS)
    assert not legal_move(Phase.CHECKING, Phase.ROLLING_BACK, Fallback.NONE)
    assert not legal_move(Phase.STAGING, Phase.ACTIVE, Fallback.PREVIOUS)


@pytest.mark.parametrize(
    ("behaviour", "no_rollback", "outcome"),
    [
        (None, False, Phase.ACTIVE),
        ("bad_unit", False, Phase.ABORTED),
        ("crash", False, Phase.ROLLED_BACK),
        ("never_ready", False, Phase.ROLLED_BACK),
        ("health_only", True, Phase.FAILED),
    ],
)
def test_the_engine_moves_only_as_the_table_says(
    world: World, behaviour: str | None, no_rollback: bool, outcome: Phase
) -> None:
    """A first switch, then a second whose engine behaves as ``behaviour``: every move recorded is the
    table's (the guard in conftest asserts each one as it is made), and the outcome is where it leads."""
    assert world.switch("alpha").phase is Phase.ACTIVE
    if behaviour is not None:
        world.host.behaviours["vllm-beta.service"] = behaviour
    dep = world.switch("beta", no_rollback=no_rollback)
    assert dep.phase is outcome
    moves = [p for p, _ in world.store.marks[dep.id]]
    assert all(legal_move(Phase(a), Phase(b), dep.fallback) for a, b in pairwise(moves))


def test_the_guard_catches_a_move_outside_the_table(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code that chooses a move itself (here: every step leads straight to checking) is caught."""
    monkeypatch.setattr("orchestrator.deploy.deployer.advance", lambda phase, event, fallback: Phase.CHECKING)
    with pytest.raises(AssertionError, match="planned -> checking is not in core/states.py's table"):
        world.switch("alpha")
