"""Before anything stops: every box of the group answers, knows the model as the controller does,
and is idle. One fan-out per question; any failure refuses the whole rollout, naming every host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.core.catalog import Model
from orchestrator.core.documents import DocumentError, toml_document
from orchestrator.errors import Busy, OrchestratorError, UsageError
from orchestrator.rollout.fanout import HostRequest, run_all


@dataclass(frozen=True)
class BoxView:
    host: str
    box_host: str  # the box's own name for itself (its deploy.toml)
    serving: str | None
    baseline_id: int | None  # its newest deployment id before the rollout


def refuse(errors: Mapping[str, OrchestratorError], what: str) -> OrchestratorError:
    """One error for many hosts: the first one's kind (its exit code), every host named."""
    first = next(iter(errors.values()))
    text = "; ".join(f"{h}: {_short(e)}" for h, e in errors.items())
    out = OrchestratorError.__new__(type(first))
    OrchestratorError.__init__(out, f"rollout refused before anything stopped ({what}): {text}")
    out.exit_code = first.exit_code
    return out


def _short(exc: OrchestratorError) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def check_boxes(clients: Mapping[str, AgentClient], model: Model) -> dict[str, BoxView]:
    """Reachable agents, the model in every box's catalog (same repo and revision), nothing running."""
    shown = run_all([HostRequest(h, c, "config_show") for h, c in clients.items()])
    errors = {h: r for h, r in shown.items() if isinstance(r, OrchestratorError)}
    if errors:
        raise refuse(errors, "unreachable or without an agent")
    for host, result in shown.items():
        _same_model(host, result, model, errors)
    if errors:
        raise refuse(errors, "the boxes' deploy.toml")
    status = run_all([HostRequest(h, c, "status", {"host": None}) for h, c in clients.items()])
    history = run_all([HostRequest(h, c, "history", {"host": None, "limit": 1}) for h, c in clients.items()])
    views: dict[str, BoxView] = {}
    for host in clients:
        st, hist = status[host], history[host]
        bad = st if isinstance(st, OrchestratorError) else hist if isinstance(hist, OrchestratorError) else None
        if bad is not None:
            errors[host] = bad
            continue
        running = [f"{op} on {h}" for h, op in (st.get("agent") or {}).get("running", {}).items()]
        entries = st.get("hosts") or {}
        running += [f"deployment #{d['id']} ({d['model']}) in phase {d['phase']}"
                    for e in entries.values() for d in e.get("running", [])]
        if running:
            errors[host] = Busy(f"busy: {', '.join(running)}")
            continue
        box_host, entry = next(iter(entries.items())) if entries else (host, {})
        serving = (entry.get("serving") or {}).get("model")
        views[host] = BoxView(host=host, box_host=box_host, serving=serving,
                              baseline_id=int(hist[0]["id"]) if hist else None)
    if errors:
        raise refuse(errors, "a box is busy or did not answer")
    return views


def _same_model(host: str, result: Any, model: Model, errors: dict[str, OrchestratorError]) -> None:
    try:
        catalog = toml_document(str((result or {}).get("text", "")), "its agent's deploy.toml")
    except DocumentError as exc:
        errors[host] = UsageError(f"its agent's deploy.toml does not parse: {exc.reason}")
        return
    entry = (catalog.get("models") or {}).get(model.name)
    if not isinstance(entry, dict):
        errors[host] = UsageError(f"its agent's deploy.toml has no model {model.name!r} (add it there, same "
                                  "repo and revision, or `orchestrator --host ... config push`)")
        return
    for key in ("repo", "revision"):
        theirs, ours = entry.get(key, "main" if key == "revision" else None), getattr(model, key)
        if theirs != ours:
            errors[host] = UsageError(f"its agent's model {model.name} has {key} {theirs!r}, the controller's "
                                      f"deploy.toml says {ours!r}")
            return
