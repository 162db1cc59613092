"""What serves on a host, as the store keeps it: the serving pointer and, with the front proxy, the
serving set. Every change of them is built here, as one ServingChange written in one transaction (a
crash between the pointer and the set left `status` naming a stopped model): with a deployment's
outcome (the deployer's transition: ``outcome``; an adoption: ``joined``) or alone (``leave``: a model
stopped or put to sleep outside a switch).
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.core.records import ServingChange
from orchestrator.core.switch_plan import SwitchPlan
from orchestrator.ports import StateStore


def outcome(host: str, revision: int, *, target: bool, plan: SwitchPlan | None, peers: Iterable[str]) -> ServingChange:
    """A deployment's outcome: its ``target`` serves (else nothing of it does), beside what its ``plan``
    kept in the set; its other nodes (``peers``) serve (part of) this model, not what they served alone."""
    sets: tuple[tuple[str, tuple[int, ...]], ...] = ()
    if plan is not None:
        kept = tuple(r for r in plan.before if r not in plan.displaced)
        sets = ((host, (*kept, revision) if target else kept),)
    pointers: list[tuple[str, int | None]] = [(peer, None) for peer in peers]
    pointers.append((host, revision if target else None))
    return ServingChange(pointers=tuple(pointers), sets=sets)


def joined(store: StateStore, host: str, revision: int, *, in_set: bool) -> ServingChange:
    """``revision`` (one that already runs: an adoption) serves on ``host``; with ``in_set`` (the front
    proxy) beside what serves there."""
    sets = ((host, (*(d.revision for d in store.serving_set(host)), revision)),) if in_set else ()
    return ServingChange(pointers=((host, revision),), sets=sets)


def leave(store: StateStore, host: str, revision: int, *, in_set: bool) -> None:
    """``revision`` no longer serves on ``host``: the pointer is cleared where it named it, and with
    ``in_set`` (the front proxy) the set keeps the others; written at once."""
    current = store.serving(host)
    rest = tuple(d.revision for d in store.serving_set(host) if d.revision != revision)
    store.move_serving(
        ServingChange(
            pointers=((host, None),) if current is not None and current.revision == revision else (),
            sets=((host, rest),) if in_set else (),
        )
    )
