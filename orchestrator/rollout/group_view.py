"""`status --group G` and `history --group G`: every box of a group through its own agent, one line
per host, and which hosts run which revision of which model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.client.backends import AgentClient
from orchestrator.errors import OrchestratorError
from orchestrator.rollout.fanout import HostRequest, run_all


def group_status(clients: Mapping[str, AgentClient]) -> dict[str, Any]:
    status = run_all([HostRequest(h, c, "status", {"host": None}) for h, c in clients.items()])
    newest = run_all([HostRequest(h, c, "history", {"host": None, "limit": 10}) for h, c in clients.items()])
    hosts: dict[str, Any] = {}
    by_revision: dict[str, list[str]] = {}
    for h in clients:
        st, hist = status[h], newest[h]
        if isinstance(st, OrchestratorError):
            hosts[h] = {"error": str(st).splitlines()[0]}
            continue
        entry: dict[str, Any] = next(iter((st.get("hosts") or {}).values()), {})
        serving = entry.get("serving") or None
        row: dict[str, Any] = {
            "serving": serving,
            "running": entry.get("running", []),
            "unit_sha256": None,
            "weights_revision": None,
        }
        if serving is not None and not isinstance(hist, OrchestratorError):
            dep = next((d for d in hist if d["revision"] == serving["revision"]), None) or {}
            row["unit_sha256"], row["weights_revision"] = dep.get("unit_sha256"), dep.get("weights_revision")
        hosts[h] = row
        # the unit text differs per box (its own bind address): a model's revision is its weights' commit
        key = f"{serving['model']}@{row['weights_revision'] or '?'}" if serving else "nothing"
        by_revision.setdefault(key, []).append(h)
    return {"hosts": hosts, "revisions": by_revision}


def group_history(clients: Mapping[str, AgentClient], limit: int) -> list[dict[str, Any]]:
    """Every host's deployments, newest first across the group, each tagged with its host's name."""
    rows: list[dict[str, Any]] = []
    for h, result in run_all(
        [HostRequest(h, c, "history", {"host": None, "limit": limit}) for h, c in clients.items()]
    ).items():
        if isinstance(result, OrchestratorError):
            # marked as such: a deployment record has an "error" key too (None when it went well)
            rows.append(
                {"group_host": h, "unreachable": True, "error": str(result).splitlines()[0], "created_at": None}
            )
            continue
        rows += [{"group_host": h, **d} for d in result]
    # unreachable hosts first (created_at None: JSON has no infinity), then newest first
    rows.sort(key=lambda d: float("inf") if d["created_at"] is None else d["created_at"], reverse=True)
    return rows[:limit] if limit else rows
