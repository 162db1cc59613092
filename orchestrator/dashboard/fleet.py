"""The fleet page's reader, in a controller's agent: its groups, each box's state and its rollouts.

Every fact comes from the controller's own answers: the groups from its catalog, each box's state from
that box's agent (the `status --group` fan-out, over this agent's SSH identity like its rollouts), a
rollout from `rollout_status` and the progress its running job publishes. The boxes are asked only when
a page reads the view (an open live page: every refresh_s); their connections close when no page has
read for ``IDLE_CLOSE_S``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from orchestrator import logs
from orchestrator.client.backends import AgentClient
from orchestrator.core import dashboard_fleet as fv
from orchestrator.errors import OrchestratorError
from orchestrator.rollout.fanout import HostRequest, run_all
from orchestrator.rollout.group_view import group_status

log = logs.get_logger()

IDLE_CLOSE_S = 60.0
OLDER = 5  # ended rollouts a group shows under its newest one


class FleetView:
    def __init__(self, agent: Any, bump: Any, refresh_s: float) -> None:
        self.agent = agent
        self.bump = bump  # tells open pages that something changed
        self.refresh_s = refresh_s
        self.boxes: tuple[float, dict[str, Any]] | None = None  # (when, group_status's hosts)
        self.lock = threading.Lock()  # the boxes' connections: one reader at a time
        self.clients: dict[str, AgentClient] = {}
        self.last_read = 0.0
        self.live: dict[Any, dict[str, dict[str, Any]]] = {}  # rollout job -> host -> {phase, line}
        self.lock_live = threading.Lock()  # guards live

    def is_controller(self) -> bool:
        return bool(self.agent.catalog.groups)

    # -- the controller's running rollouts ----------------------------------------------------------
    def start(self) -> None:
        """Be told of each rollout job as the controller starts it (before its first event), and listen
        to those it drives already."""
        controller = self.agent.controller
        controller.observers.append(self.attach)
        with controller.lock:
            jobs = list(controller.runs.values())
        for job in jobs:
            self.attach(job)

    def stop(self) -> None:
        if self.attach in self.agent.controller.observers:
            self.agent.controller.observers.remove(self.attach)
        self.close()

    def attach(self, job: Any) -> None:
        with self.lock_live:
            if job in self.live:
                return
            self.live[job] = {}
        threading.Thread(target=self._listen, args=(job, job.listen()), daemon=True, name="dashboard-rollout").start()
        self.bump()

    def _listen(self, job: Any, q: Any) -> None:
        try:
            while (item := q.get()) is not job.END:
                if (
                    isinstance(item, dict)
                    and "event" in item
                    and fv.live_update(self.live[job], str(item["event"]), item.get("fields") or {})
                ):
                    self.bump()
        finally:
            job.unlisten(q)
            with self.lock_live:
                self.live.pop(job, None)  # ended: its record says the rest
            self.bump()

    def _live_of(self, rid: int) -> dict[str, dict[str, Any]]:
        """host -> {phase, line} of the rollout's running job (empty when nothing drives it here)."""
        controller = self.agent.controller
        with controller.lock:
            job = controller.runs.get(rid)
        return dict(self.live.get(job, {})) if job is not None else {}

    def close_idle(self, now: float) -> None:
        with self.lock:
            if self.clients and now - self.last_read > IDLE_CLOSE_S:
                self._close()

    def close(self) -> None:
        with self.lock:
            self._close()

    def _forget(self, host: str) -> None:
        closer = getattr(self.clients.pop(host, None), "close", None)
        if closer is not None:
            closer()

    def _close(self) -> None:
        self.boxes = None
        for c in self.clients.values():
            closer = getattr(c, "close", None)
            if closer is not None:
                closer()
        self.clients.clear()

    # -- one view of the fleet ----------------------------------------------------------------------
    def read(self, query: Any) -> dict[str, Any]:
        """Every group with its boxes and its newest rollout; ``query`` answers an operation as the
        control socket does (rollout_status)."""
        catalog = self.agent.catalog
        hosts = sorted({h for g in catalog.groups.values() for h in g.hosts})
        with self.lock:
            now = self.last_read = time.time()
            # the boxes at most once per refresh_s: a burst of rollout events re-reads only the record
            if self.boxes is None or now - self.boxes[0] >= self.refresh_s or set(self.boxes[1]) != set(hosts):
                for h in hosts:
                    if h not in self.clients:
                        self.clients[h] = self.agent.controller.connect(catalog.hosts[h])
                self.boxes = (now, group_status({h: self.clients[h] for h in hosts})["hosts"])
                for h, row in self.boxes[1].items():
                    if "error" in row:  # its connection may be dead (SSH does not come back): connect anew next time
                        self._forget(h)
            status = self.boxes[1]
        rollouts = self._rollouts(query)
        groups = []
        for name, g in catalog.groups.items():
            mine = [r for r in rollouts if r["group"] == name]
            ro = mine[0] if mine else None
            live = self._live_of(ro["id"]) if ro else {}
            groups.append(
                {
                    "name": name,
                    "hosts": list(g.hosts),
                    "canary": g.canary,
                    "batch": g.batch,
                    "max_failures": g.max_failures,
                    "gate": g.gate,
                    "models": sorted(m.name for m in catalog.models.values() if m.group == name),
                    "boxes": fv.box_rows(g.hosts, status, live if ro and ro["status"] == "running" else {}),
                    "rollout": ro,
                    "older": mine[1 : 1 + OLDER],
                }
            )
        return {"at": time.time(), "groups": groups}

    def box(self, host: str) -> dict[str, Any] | None:
        """One box of a group (None: no group has it), asked through the page's connection to it."""
        catalog = self.agent.catalog
        group = next((name for name, g in catalog.groups.items() if host in g.hosts), None)
        if group is None:
            return None
        with self.lock:
            self.last_read = time.time()
            if host not in self.clients:
                self.clients[host] = self.agent.controller.connect(catalog.hosts[host])
            client = self.clients[host]
            status = run_all([HostRequest(host, client, "status", {"host": None})])[host]
            history = run_all([HostRequest(host, client, "history", {"host": None, "limit": 20})])[host]
            if isinstance(status, OrchestratorError):
                self._forget(host)  # a dead connection: connect anew next time
        models = [m for m in catalog.models.values() if m.group == group]
        return {"at": time.time(), "group": group, **fv.box_view(host, models, _or_error(status), _or_error(history))}

    def _rollouts(self, query: Any) -> list[dict[str, Any]]:
        """The unfinished rollouts and each group's last few, newest first, each as rollout_status answers."""
        store = self.agent.controller.store
        recent = {r.id for g in self.agent.catalog.groups for r in store.recent(1 + OLDER, g)}
        ids = sorted({r.id for r in store.unfinished()} | recent, reverse=True)
        out = []
        for rid in ids:
            try:
                summary = query("rollout_status", {"id": rid})
            except OrchestratorError as exc:
                log.info("dashboard_rollout_unreadable", rollout=rid, error=str(exc))
                continue
            out.append(
                fv.rollout_view(summary, abort_requested=store.get(rid).abort_requested, live=self._live_of(rid))
            )
        return out


def _or_error(answer: Any) -> Any:
    """An agent's answer, or the first line of the error that came instead."""
    return str(answer).splitlines()[0] if isinstance(answer, OrchestratorError) else answer
