"""What the fronts read about hosts and models: status, history, explain, schedules, probe (no lock,
nothing changes on a box; the probes ask systemd and the engines)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from orchestrator.core import schedule as sched
from orchestrator.core.doctor import report, unreachable_verdict
from orchestrator.core.observed import UnitState
from orchestrator.core.records import Deployment, Mode
from orchestrator.core.render import model_dir_for, render_unit
from orchestrator.core.resident import ASLEEP
from orchestrator.core.states import Phase
from orchestrator.core.switch_plan import SwitchPlan
from orchestrator.core.watch import to_bring_back
from orchestrator.deploy import residents, warm
from orchestrator.deploy.locks import host_held
from orchestrator.deploy.operations_base import OperationsBase
from orchestrator.deploy.planning import default_template
from orchestrator.errors import OrchestratorError, TransportError, UsageError


@dataclass(frozen=True)
class Lost:
    """A model the host's newest switch, failed, left with no engine behind its served name."""

    failed: Deployment  # that switch
    model: Deployment  # the revision that served before it
    blockers: tuple[str, ...]  # why it cannot be woken now (empty: its wake fits)


class OperationsViews(OperationsBase):
    """The read-only side of Operations: what serves, what ran, what a switch would do."""

    def probe(self, host: str) -> tuple[Deployment | None, bool, UnitState | None]:
        """(what serves, is it healthy, its unit as systemd sees it); raises TransportError when the
        host cannot be reached, so the watch can tell "down" from "cannot look" (is_healthy folds
        both into False)."""
        serving = self.store.serving(host)
        if serving is None:
            return None, True, None
        unit = self.ports_for(host).systemd.unit_state(serving.spec.unit_name)
        eng = self.deployer()
        return serving, eng.is_healthy(serving), unit

    def lost(self, host: str) -> Lost | None:
        """What the watch may bring back after a failed switch (core.watch.to_bring_back), and why its
        wake does not fit now, counted in memory by PID (nvidia-smi); None when nothing was lost."""
        newest = self.store.history(host, 1)
        if not newest or (plan := self.store.plan_of(newest[0].id)) is None:
            return None
        displaced = [self.store.by_revision(host, r) for r in SwitchPlan.from_dict(plan).displaced]
        old = to_bring_back(newest[0], displaced, {d.spec.served_name for d in self.store.serving_set(host)})
        if old is None:
            return None
        ctx = self.context(host)
        rec = self.residency.residency(host).get(old.model)
        if rec is None or rec.state != ASLEEP or not residents.is_asleep(ctx, old.spec):
            state = "not running" if rec is None or rec.state != ASLEEP else "not answering as a sleeper"
            why = f"{old.model} is {state}: the watch only wakes a sleeper; `orchestrator switch {old.model}` starts it"
            return Lost(newest[0], old, (why,))
        reasons = warm.wake_shortfall(
            ctx.ports.gpus, residents.engine_of(ctx, old.spec), sleepers=residents.sleepers(ctx, but=[old.model])
        )
        return Lost(newest[0], old, tuple(reasons))

    def schedules(self, now: float, next_runs: dict[str, float] | None = None) -> list[dict[str, Any]]:
        """Each schedule with its next firing time and the last thing it did."""
        events = [e for e in self.store.events(limit=500) if e.get("schedule")]
        rows = []
        for name, s in self.catalog.schedules.items():
            # the next run that acts: firings outside the window are skipped, so they are not shown
            first = next_runs.get(name) if next_runs is not None else sched.next_run(s, now)
            nxt = None if first is None else sched.next_run_in_window(s, first)
            last = next((e for e in events if e["schedule"] == name), None)
            shown = (
                "never: its cron has no fire time left"
                if first is None
                else "never: no firing of its cron falls inside its window"
                if nxt is None
                else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nxt))
            )
            rows.append(
                {
                    "name": name,
                    "cron": s.cron,
                    "action": s.action,
                    "model": s.model,
                    "window": s.window,
                    "next_run": shown,
                    "next_run_ts": nxt,
                    "last": last,
                }
            )
        return rows

    def doctor(self, host: str | None, models: list[str]) -> dict[str, Any]:
        """What the box of ``host`` (else of the models named, else the only one) will fail on, one verdict a
        check (core/doctor.py); every model of that box when none is named."""
        from orchestrator.deploy.doctor import diagnose  # only this command probes so much

        target = self.catalog.target(model=models[0] if models and host is None else None, host=host)
        on = self.catalog.models_on(target.name)
        elsewhere = [m for m in models if m not in on]
        if elsewhere:
            raise UsageError(
                f"doctor: {', '.join(elsewhere)} not on host {target.name} (its models: "
                f"{', '.join(on) or 'none'}): name one host's models, or --on HOST"
            )
        template = self.template or default_template()
        units: dict[str, tuple[str, str]] = {}
        for name in models or on:
            model = self.catalog.models[name]
            folder = model_dir_for(self.catalog, model, host=target)
            units[name] = (render_unit(self.catalog, model, template, model_dir=folder, host=target).text, folder)
        try:
            ports = self.ports_for(target.name)
        except TransportError as exc:  # no shell, no systemd: nothing else can be asked
            return report(target.name, [unreachable_verdict(str(exc))])
        return report(target.name, diagnose(self.catalog, ports, units))

    def explain(self, model: str) -> dict[str, Any]:
        """What a switch to MODEL would do to the host's serving set, and why (the host's I/O: one GPU
        reading, for whether it fits beside what serves)."""
        host = self.catalog.target(model=model).name
        eng = self.deployer()
        spec = eng.spec_for(self.catalog.models[model])
        if not self.catalog.proxy.enabled:
            serving = self.store.serving(host)
            return {
                "host": host,
                "model": model,
                "mode": Mode.STOP_START.value,
                "displaced": [serving.model] if serving else [],
                "reason": "no front proxy ([proxy] enabled = false): the "
                "serving model stops before the new one starts; clients see connection errors meanwhile",
                "asleep": self._sleepers(host),
            }
        plan = eng.explain(host, spec)
        displaced = [self.store.by_revision(host, r).model for r in plan.displaced]
        mode, reason = plan.mode.value, plan.reason
        asleep = self.residency.residency(host).get(model)
        if asleep is not None and asleep.state == ASLEEP:
            # staging's test, from the records: the unit it would run is the one that went to sleep
            slept = next(
                (d for d in self.store.history(host, limit=200) if d.model == model and d.phase is Phase.ACTIVE), None
            )
            if slept is not None and slept.spec.unit_sha == spec.unit_sha and plan.mode is Mode.BESIDE:
                reason = reason.replace(f"{model} starts beside", f"{model} is asleep and wakes beside", 1)
            elif slept is not None and slept.spec.unit_sha == spec.unit_sha:
                others = ", ".join(displaced)
                mode, reason = (
                    "warm",
                    (
                        f"{model} is asleep ({asleep.level or 'asleep'}) with its unit unchanged: a warm switch; "
                        f"the route moves to {model} at once and its engine holds what arrives until it wakes "
                        "(no 503 gap)"
                        + (
                            f"; {others} drain, then sleep (or stop, when the host's RAM for sleepers is full)"
                            if others
                            else ""
                        )
                    ),
                )
            else:
                reason += f" ({model} is asleep, but its unit changed since: it starts cold, not warm)"
        return {
            "host": host,
            "model": model,
            "mode": mode,
            "reason": reason,
            "displaced": displaced,
            "asleep": self._sleepers(host),
        }

    def _sleepers(self, host: str) -> list[dict[str, object]]:
        """The host's recorded sleepers, least recently served first (the order `plan` evicts in)."""
        asleep = [r for r in self.residency.residency(host).values() if r.state == ASLEEP]
        asleep.sort(key=lambda r: (r.last_served is not None, r.last_served or 0.0))
        return [r.to_dict() for r in asleep]

    def _node_states(self, dep: Deployment, probe: bool) -> list[dict[str, Any]]:
        """Each unit of a multi-node model: its host, role and (probed) systemd state."""
        rows = [
            (n.host, n.role + (f" rank {n.rank}" if n.role == "headless" else ""), n.unit_name) for n in dep.spec.nodes
        ]
        rows.append((dep.host, "engine (API)" if dep.spec.backend == "ray" else "rank 0 (API)", dep.spec.unit_name))
        out = []
        for host, role, unit in rows:
            row: dict[str, Any] = {"host": host, "role": role, "unit": unit, "state": "not probed"}
            if probe:
                try:
                    seen = self.ports_for(host).systemd.unit_state(unit)
                    # Restarts systemd made on its own since the unit's start: a rank that came back alone.
                    row |= {"state": seen.active_state, "restarts": seen.n_restarts}
                except OrchestratorError as exc:
                    row["state"] = f"unreachable: {exc}"
            out.append(row)
        return out

    def _rank_of(self, host: str) -> list[dict[str, Any]]:
        """The multi-node models headed elsewhere that have a unit on ``host`` (its own record says nothing)."""
        out = []
        for head in self.catalog.hosts:
            dep = self.store.serving(head) if head != host else None
            if dep is not None and host in dep.spec.node_hosts:
                out.append(
                    {
                        "model": dep.model,
                        "head": head,
                        "revision": dep.revision,
                        "units": [n.unit_name for n in dep.spec.nodes if n.host == host],
                    }
                )
        return out

    def history(self, host: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        if host is not None:
            self.catalog.host(host)
        out = []
        eng = self.deployer()
        # Models on demand: the requests each on-demand switch served and their waits (agent/demand.py).
        demand = {e.get("deployment_id"): e for e in reversed(self.store.events(host=host, kind="demand", limit=500))}
        # Warm switches: how long the route waited for a quiet moment of the displaced engines (warm note "quiet").
        warm = self.store.events(host=host, kind="warm", limit=20 * limit)
        quiet = {e.get("deployment_id"): e for e in reversed(warm) if e.get("step") == "quiet"}
        for d in self.store.history(host, limit):
            row, plan = d.to_dict(), self.store.plan_of(d.id)
            if d.id in demand:
                row["demand"] = {
                    k: demand[d.id].get(k)
                    for k in ("requests", "cancelled", "cold", "waits_s", "wait_max_s", "timeline_ms")
                }
            if d.id in quiet:
                row["quiet"] = {k: quiet[d.id].get(k) for k in ("seconds", "outcome", "in_flight")}
            if d.spec.nodes:  # what it did on each node, as persisted while it ran
                row["node_progress"] = [
                    {k: e.get(k) for k in ("phase", "step", "node", "unit", "at")} for e in eng.node_progress(d)
                ]
            if plan is not None:
                kept = [r for r in plan["before"] if r not in plan["displaced"]]
                row["plan"] = {
                    "mode": plan["mode"],
                    "reason": plan["reason"],
                    "set_after": sorted(self.store.by_revision(d.host, r).model for r in [*kept, d.revision]),
                }
            out.append(row)
        return out

    def _residency(self, host: str, probe: bool) -> dict[str, Any]:
        """Warm switches: each model serving, asleep (level) or stopped, the host RAM sleepers hold,
        and (probed) each GPU's memory by process, with the model whose unit it belongs to."""
        records = self.residency.residency(host)
        h = self.catalog.hosts[host]
        models = []
        for name in self.catalog.models_on(host):
            rec = records.get(name)
            models.append(
                {
                    "model": name,
                    "state": rec.state if rec else "stopped",
                    "level": rec.level if rec else None,
                    "since": rec.since if rec else None,
                    "last_served": rec.last_served if rec else None,
                    "ram_gib": round(rec.ram_gib, 3) if rec else 0.0,
                }
            )
        out: dict[str, Any] = {
            "models": models,
            "sleep_ram_gib": round(sum(r.ram_gib for r in records.values()), 3),
            "ram_budget_gib": h.sleep_ram_budget(),
            "residue_gib": h.sleep_residue_gib,
        }
        if probe:
            try:
                ports = self.ports_for(host)
                for m in models:  # observed: a record of a unit stopped since (a reboot, systemctl) is stale
                    if (
                        m["state"] != "stopped"
                        and not ports.systemd.unit_state(self.catalog.models[str(m["model"])].unit_name).is_active
                    ):
                        m.update(state="stopped", level=None, ram_gib=0.0)
                owner = {
                    pid: n
                    for n in self.catalog.models_on(host)
                    for pid in ports.systemd.cgroup_pids(self.catalog.models[n].unit_name)
                }
                snap = ports.gpus.snapshot()
                out["gpus"] = [
                    {
                        "index": g.index,
                        "used_mib": g.memory_used_mib,
                        "total_mib": g.memory_total_mib,
                        "processes": [
                            {
                                "pid": p.pid,
                                "mib": p.used_memory_mib,
                                "model": owner.get(p.pid),
                                "state": records[owner[p.pid]].state if owner.get(p.pid) in records else None,
                            }
                            for p in snap.processes
                            if p.gpu_index == g.index
                        ],
                    }
                    for g in snap.gpus
                ]
            except OrchestratorError as exc:
                out["gpus_error"] = str(exc)
        return out

    def status(self, host: str | None = None, probe: bool = True) -> dict[str, Any]:
        hosts = [self.catalog.host(host).name] if host else list(self.catalog.hosts)
        out: dict[str, Any] = {"at": time.time(), "hosts": {}}
        for name in hosts:
            serving = self.store.serving(name)
            running = self.store.unfinished(name)
            entry: dict[str, Any] = {
                "serving": None
                if serving is None
                else {
                    "revision": serving.revision,
                    "model": serving.model,
                    "unit": serving.spec.unit_name,
                    "url": serving.spec.base_url,
                },
                "running": [
                    {
                        "id": d.id,
                        "revision": d.revision,
                        "model": d.model,
                        "phase": d.phase.value,
                        "unit": d.spec.unit_name,
                        "trigger": d.trigger,
                    }
                    for d in running
                ],
                # unfinished while nothing holds the host: interrupted (Ctrl-C, a crash), not running
                **({"interrupted": True} if running and host_held(self.state_dir, name) is False else {}),
            }
            if serving is None and not running:
                # nothing serves because the newest deployment did not end active: status names it
                last = next(iter(self.store.history(name, limit=1)), None)
                if last is not None and last.phase is not Phase.ACTIVE:
                    entry["last"] = {
                        "id": last.id,
                        "revision": last.revision,
                        "model": last.model,
                        "outcome": last.phase.value,
                        "error": last.error,
                    }
            eng = self.deployer()
            if serving is not None and serving.spec.nodes:
                # Nodes before health: restart counts only grow, so a rank this row shows restarted is
                # one the health probe after it sees restarted too (never "healthy" beside "restarted 1x").
                entry["serving"]["nodes"] = self._node_states(serving, probe)
            if probe and serving is not None:
                entry["serving"]["healthy"] = eng.is_healthy(serving)
            if self.catalog.proxy.enabled:
                cfg, h = self.catalog.proxy, self.catalog.hosts[name]
                bind = cfg.bind or h.bind or h.address
                where = h.address if bind in ("0.0.0.0", "::") else bind
                entry["endpoint"] = f"http://{f'[{where}]' if ':' in where else where}:{cfg.port}/v1"
                entry["models"] = [
                    {
                        "revision": d.revision,
                        "model": d.model,
                        "served_name": d.spec.served_name,
                        "gpus": list(d.spec.gpus),
                        "unit": d.spec.unit_name,
                        "url": d.spec.base_url,
                        **({"healthy": eng.is_healthy(d)} if probe else {}),
                    }
                    for d in self.store.serving_set(name)
                ]
            if ranks := self._rank_of(name):
                entry["node_of"] = ranks
            if any(self.catalog.models[m].sleep for m in self.catalog.models_on(name)):
                entry["residency"] = self._residency(name, probe)
            out["hosts"][name] = entry
        return out
