"""The fleet page's rows, shaped from a controller's own answers (pure, no I/O).

A controller's agent knows its groups from its catalog, each box's state from that box's agent (the
same `status`/`history` fan-out as `status --group`), and a rollout from `rollout_status` (its record
in rollouts.db) and the progress its running job publishes. Nothing here keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.core.dashboard import history_rows, model_rows, progress_line, sleep_summary
from orchestrator.core.rollout import ENDED as ENDED_HOST
from orchestrator.core.states import DOWN


def own_hosts(catalog: Any) -> list[str]:
    """The hosts this agent owns (its box page shows them): every host but those it reaches only as its
    fleet's controller, a group's boxes over SSH, whose own agents own them (and the fleet page shows)."""
    grouped = {h for g in catalog.groups.values() for h in g.hosts}
    return [n for n, h in catalog.hosts.items() if n not in grouped or h.transport == "local"]


def box_rows(
    hosts: Sequence[str], status: Mapping[str, Any], live: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per box of a group: what it serves (model, revision, health) and what it is doing (its
    agent's running operation and phase, or the phase the rollout's progress last reported).

    ``status``: group_view.group_status's ``hosts``; ``live``: host -> {"phase", "line"} from the
    running rollout's events."""
    rows = []
    for h in hosts:
        entry = status.get(h) or {"error": "no answer"}
        ev = live.get(h) or {}
        if entry.get("error"):
            rows.append(
                {
                    "host": h,
                    "reachable": False,
                    "error": entry["error"],
                    "serving": None,
                    "revision": None,
                    "health": "",
                    "activity": "",
                    "weights": None,
                }
            )
            continue
        serving = entry.get("serving") or {}
        running = entry.get("running") or []
        phase = ev.get("phase") or (running[-1].get("phase") if running else None)
        activity = f"switching ({phase})" if phase else "busy" if running else "idle"
        if not serving:
            health = ""
        elif phase in DOWN:  # the switch has stopped what the record still names (as the box page says)
            health = "down: switching"
        else:
            health = "healthy" if serving.get("healthy", True) else "unhealthy"
        rows.append(
            {
                "host": h,
                "reachable": True,
                "error": None,
                "serving": serving.get("model"),
                "revision": serving.get("revision"),
                "health": health,
                "activity": activity,
                "weights": entry.get("weights_revision"),
                "line": ev.get("line") or "",
            }
        )
    return rows


def batch_state(states: Sequence[str]) -> str:
    """A batch as one word: pending, switching, done, failed (a host failed), reverted."""
    if any(s == "switching" for s in states):
        return "switching"
    if all(s in ENDED_HOST for s in states):
        if "failed" in states:
            return "failed"
        return "reverted" if "reverted" in states else "done"
    if all(s not in ENDED_HOST for s in states):
        return "pending"
    return "partly done"


def rollout_view(
    summary: Mapping[str, Any], *, abort_requested: bool, live: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """A rollout (``rollout_status``'s answer) by batch: the canary, then each batch with its hosts'
    state, outcome and live phase; a label that says where it stands (between batches, an abort
    asked for, interrupted)."""
    ro = dict(summary["rollout"])
    hosts = list(summary["hosts"])
    indexes = sorted({int(h["batch"]) for h in hosts})
    batches = []
    for i in indexes:
        members = [h for h in hosts if int(h["batch"]) == i]
        name = "canary" if ro.get("canary") and i == 0 else f"batch {i if ro.get('canary') else i + 1}"
        rows = [
            {
                "host": h["host"],
                "state": h["state"],
                "outcome": h.get("outcome"),
                "error": h.get("error"),
                "deployment_id": h.get("deployment_id"),
                "seconds": None
                if h.get("switched_at") is None or h.get("ended_at") is None
                else round(float(h["ended_at"]) - float(h["switched_at"]), 1),
                "phase": (live.get(h["host"]) or {}).get("phase") if h["state"] == "switching" else None,
                "line": (live.get(h["host"]) or {}).get("line") or "",
            }
            for h in members
        ]
        batches.append({"index": i, "name": name, "state": batch_state([r["state"] for r in rows]), "hosts": rows})
    status = str(ro["status"])
    if status == "running":
        going = next((b for b in batches if b["state"] == "switching"), None)
        pending = next((b for b in batches if b["state"] == "pending"), None)
        where = (
            f"{going['name']} switching"
            if going
            else f"between batches (next: {pending['name']})"
            if pending
            else "finishing"
        )
        label = f"running: {where}" + (", abort requested: stops after this batch" if abort_requested else "")
    else:
        label = status
    return {
        **ro,
        "label": label,
        "abort_requested": abort_requested,
        "batches": batches,
        "alive": bool((ro.get("controller") or {}).get("alive")),
    }


def live_update(state: dict[str, dict[str, Any]], event: str, fields: Mapping[str, Any]) -> bool:
    """Fold one event of a rollout's progress (fields carry ``group_host``) into host -> {phase, line};
    False when the page would show nothing new (stage_progress, many a second)."""
    host = fields.get("group_host")
    if not host:
        return False
    cur = state.setdefault(str(host), {})
    before = dict(cur)
    if event == "phase":
        cur["phase"] = str(fields["phase"]) if fields.get("phase") else None
    elif event == "rollout_host" and fields.get("state") != "switching":
        cur["phase"] = None
    if event == "rollout_host":
        text = f"rollout: {fields.get('state')}" + (f" ({fields['outcome']})" if fields.get("outcome") else "")
    else:
        text = progress_line(event, fields)
    if text:
        cur["line"] = text
    return cur != before


def box_view(host: str, models: Sequence[Any], status: Any, history: Any) -> dict[str, Any]:
    """One box of a group as the fleet page's box page shows it, from its own agent's ``status`` and
    ``history`` answers (an error instead of either: that error): what it serves, each group model's
    state on it, the sleepers' RAM, its running operation and its recent history."""
    if isinstance(status, str):
        return {"name": host, "error": status}
    entry: Mapping[str, Any] = next(iter((status.get("hosts") or {}).values()), {})
    return {
        "name": host,
        "error": None,
        "serving": entry.get("serving"),
        "endpoint": entry.get("endpoint"),
        "models": model_rows(models, entry),
        "sleep": sleep_summary(entry.get("residency")),
        "running": list(entry.get("running") or []),
        "interrupted": bool(entry.get("interrupted")),
        "history": [] if isinstance(history, str) else history_rows(history[:20]),
        "history_error": history if isinstance(history, str) else None,
        "tune": [],
    }
