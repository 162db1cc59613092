"""Before anything stops: every box of the group answers, knows the model as the controller does,
and is idle. One fan-out, one round trip per box carrying every question; any failure refuses the
whole rollout, naming every host."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.contract.wire import error_of
from orchestrator.core.catalog import Model
from orchestrator.core.documents import DocumentError, toml_document
from orchestrator.errors import AgentError, Busy, OrchestratorError, UsageError
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
    """Reachable agents, the model in every box's catalog (same repo and revision), nothing running.
    One round trip per box (its agent's ``preflight``); a box whose agent predates it is asked the
    three questions one by one."""
    answers = _ask(clients)
    errors = {h: a["config_show"] for h, a in answers.items() if isinstance(a["config_show"], OrchestratorError)}
    if errors:
        raise refuse(errors, "unreachable or without an agent")
    for host, answer in answers.items():
        _same_model(host, answer["config_show"], model, errors)
    if errors:
        raise refuse(errors, "the boxes' deploy.toml")
    views: dict[str, BoxView] = {}
    for host, answer in answers.items():
        st, hist = answer["status"], answer["history"]
        bad = st if isinstance(st, OrchestratorError) else hist if isinstance(hist, OrchestratorError) else None
        if bad is not None:
            errors[host] = bad
            continue
        running = [f"{op} on {h}" for h, op in (st.get("agent") or {}).get("running", {}).items()]
        entries = st.get("hosts") or {}
        running += [
            f"deployment #{d['id']} ({d['model']}) in phase {d['phase']}"
            for e in entries.values()
            for d in e.get("running", [])
        ]
        if running:
            errors[host] = Busy(f"busy: {', '.join(running)}")
            continue
        box_host, entry = next(iter(entries.items())) if entries else (host, {})
        serving = (entry.get("serving") or {}).get("model")
        views[host] = BoxView(
            host=host, box_host=box_host, serving=serving, baseline_id=int(hist[0]["id"]) if hist else None
        )
    if errors:
        raise refuse(errors, "a box is busy or did not answer")
    return views


PARTS = ("config_show", "status", "history")


def _ask(clients: Mapping[str, AgentClient]) -> dict[str, dict[str, Any]]:
    """Each box's three answers (a result or the error it raised), in the order of ``clients``."""
    replies = run_all([HostRequest(h, c, "preflight") for h, c in clients.items()])
    answers: dict[str, dict[str, Any]] = {}
    older = []
    for host, reply in replies.items():
        if _predates_preflight(reply):
            older.append(host)
        elif isinstance(reply, OrchestratorError):  # unreachable: every part says so
            answers[host] = dict.fromkeys(PARTS, reply)
        else:
            answers[host] = {p: _part(reply, p, host) for p in PARTS}
    if older:
        asked = {h: clients[h] for h in older}
        shown = run_all([HostRequest(h, c, "config_show") for h, c in asked.items()])
        status = run_all([HostRequest(h, c, "status", {"host": None}) for h, c in asked.items()])
        history = run_all([HostRequest(h, c, "history", {"host": None, "limit": 1}) for h, c in asked.items()])
        for h in older:
            answers[h] = {"config_show": shown[h], "status": status[h], "history": history[h]}
    return {h: answers[h] for h in clients}


def _predates_preflight(reply: Any) -> bool:
    """An agent older than the ``preflight`` operation refuses it as unknown (contract/ops.lookup)."""
    return isinstance(reply, UsageError) and str(reply).startswith("unknown operation 'preflight'")


def _part(reply: Any, name: str, host: str) -> Any:
    part = reply.get(name) if isinstance(reply, dict) else None
    if not isinstance(part, dict) or ("result" not in part and "error" not in part):
        return AgentError(f"host {host}: its agent's preflight answer has no {name}")
    return error_of(part["error"]) if "error" in part else part["result"]


def _same_model(host: str, result: Any, model: Model, errors: dict[str, OrchestratorError]) -> None:
    try:
        catalog = toml_document(str((result or {}).get("text", "")), "its agent's deploy.toml")
    except DocumentError as exc:
        errors[host] = UsageError(f"its agent's deploy.toml does not parse: {exc.reason}")
        return
    entry = (catalog.get("models") or {}).get(model.name)
    if not isinstance(entry, dict):
        errors[host] = UsageError(
            f"its agent's deploy.toml has no model {model.name!r} (add it there, same "
            "repo and revision, or `orchestrator --host ... config push`)"
        )
        return
    for key in ("repo", "revision"):
        theirs, ours = entry.get(key, "main" if key == "revision" else None), getattr(model, key)
        if theirs != ours:
            errors[host] = UsageError(
                f"its agent's model {model.name} has {key} {theirs!r}, the controller's deploy.toml says {ours!r}"
            )
            return
