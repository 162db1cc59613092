"""Start the dashboard inside the agent (``[dashboard]`` of deploy.toml), off the agent's critical path."""

from __future__ import annotations

import threading
from typing import Any

from orchestrator import logs
from orchestrator.core.dashboard import socket_path
from orchestrator.dashboard.live import Live
from orchestrator.dashboard.pages import Pages
from orchestrator.dashboard.server import DashboardServer
from orchestrator.errors import OrchestratorError

log = logs.get_logger()


def tune_runs(agent: Any) -> Any:
    """The host's finished tune runs from the state store the tuner writes (no copy of its own)."""
    from orchestrator.rollout.tune import tune_store

    store = tune_store(agent.catalog)  # opened once: opening secures (chmods) the state dir and migrates

    def runs(host: str) -> list[dict[str, Any]]:
        out = []
        for r in store.finished(host):
            report = r.result or {}
            out.append(
                {
                    "id": r.id,
                    "model": r.model,
                    "created_at": r.created_at,
                    "winner": (report.get("decision") or {}).get("winner"),
                    "report": report,
                }
            )
        return out

    return runs


def start(agent: Any) -> DashboardServer | None:
    """Serve the dashboard on its Unix socket, or None when it is off or cannot start: the dashboard is an
    aid, a stale or taken socket must not keep the agent from switching (logged, as the metrics are)."""
    settings = agent.catalog.dashboard
    if not settings.enabled:
        return None
    path = socket_path(settings, agent.catalog.state_dir)
    live = Live(agent, settings.refresh_s, tune_runs(agent))
    try:
        server = DashboardServer(path, agent, Pages(live))
    except (OSError, OrchestratorError) as exc:
        log.warning("dashboard_unavailable", socket=path, error=str(exc))
        return None
    live.start()
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    log.info("dashboard_started", socket=path)
    return server
