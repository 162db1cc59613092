"""The stores beside the records: config revisions, fleet rollouts, tune runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from orchestrator.errors import StateError


class FakeConfigStore:
    """The ConfigStore port in memory, with the SQLite store's semantics (tests/unit/test_config_store.py
    runs one set of assertions against both)."""

    def __init__(self) -> None:
        self.revisions: list[tuple[float, str, str, str]] = []  # (at, sha256, operator, text); revision = index + 1
        self.deployments: dict[int, int] = {}

    def latest(self) -> tuple[int, str] | None:
        return (len(self.revisions), self.revisions[-1][1]) if self.revisions else None

    def record_if_new(
        self, at: float, sha256: str, operator: str, text: str, then: Callable[[], None] | None = None
    ) -> int:
        latest = self.latest()
        if latest is not None and latest[1] == sha256:
            revision, added = latest[0], False
        else:
            self.revisions.append((at, sha256, operator, text))
            revision, added = len(self.revisions), True
        if then is not None:
            try:
                then()
            except BaseException:  # any failure of ``then`` undoes the write, as the real transaction does; re-raised
                if added:  # the transaction rolls back: the revision is not recorded either
                    self.revisions.pop()
                raise
        return revision

    def link(self, deployment_id: int, revision: int) -> None:
        self.deployments.setdefault(deployment_id, revision)

    def links(self) -> dict[int, int]:
        return dict(self.deployments)


class FakeRolloutStore:
    """ports.RolloutStore in memory: the same records and refusals as rollout/store.py's file."""

    def __init__(self) -> None:
        from orchestrator.core.rollout import HostRecord

        self.path = "memory:rollouts"
        self.rollouts: dict[int, Any] = {}
        self.records: dict[int, list[HostRecord]] = {}
        self.times: dict[int, dict[str, list[float | None]]] = {}
        self.writes = 0  # every change, so a test can see one was made before an action

    def create(
        self,
        model: str,
        group: str,
        policy: Any,
        gate: str,
        batches: list[tuple[str, ...]],
        pid: int,
        *,
        started_by: str | None = None,
        at: float | None = None,
    ) -> int:
        from orchestrator.core.rollout import HostRecord, Rollout, RolloutStatus

        rid = len(self.rollouts) + 1
        self.rollouts[rid] = Rollout(
            id=rid,
            model=model,
            group=group,
            status=RolloutStatus.RUNNING,
            policy=policy,
            canary=policy.canary,
            gate=gate,
            started_at=at or 0.0,
            ended_at=None,
            pid=pid,
            abort_requested=False,
            reason=None,
            started_by=started_by,
        )
        self.records[rid] = [HostRecord(host=h, batch=n) for n, b in enumerate(batches) for h in b]
        self.times[rid] = {h: [None, None] for b in batches for h in b}
        self.writes += 1
        return rid

    def set_host(self, rid: int, host: str, **fields: Any) -> None:
        times = {k: fields.pop(k) for k in ("switched_at", "ended_at") if k in fields}
        allowed = {"state", "baseline_id", "deployment_id", "outcome", "error"}
        if set(fields) - allowed:
            raise StateError(f"rollout store: no host field {min(set(fields) - allowed)!r}")
        self.records[rid] = [replace(r, **fields) if r.host == host else r for r in self.records[rid]]
        for k, v in times.items():
            self.times[rid][host][0 if k == "switched_at" else 1] = v
        self.writes += 1

    def set_hosts(self, rid: int, hosts: Any) -> None:
        allowed = {"state", "baseline_id", "deployment_id", "outcome", "error", "switched_at", "ended_at"}
        bad = {k for fields in hosts.values() for k in fields} - allowed
        if bad:  # refused before any host changes, as the file's one transaction is
            raise StateError(f"rollout store: no host field {min(bad)!r}")
        if not hosts:
            return
        for host, fields in hosts.items():
            self.set_host(rid, host, **fields)
        self.writes -= len(hosts) - 1  # one commit

    def finish(self, rid: int, status: Any, reason: str | None, at: float | None = None) -> None:
        self.rollouts[rid] = replace(self.get(rid), status=status, reason=reason, ended_at=at or 0.0)
        self.writes += 1

    def take_over(self, rid: int, pid: int) -> None:
        self.rollouts[rid] = replace(self.get(rid), pid=pid)
        self.writes += 1

    def request_abort(self, rid: int) -> None:
        self.rollouts[rid] = replace(self.get(rid), abort_requested=True)
        self.writes += 1

    def get(self, rid: int) -> Any:
        if rid not in self.rollouts:
            raise StateError(f"no rollout #{rid} in {self.path}")
        return self.rollouts[rid]

    def hosts(self, rid: int) -> list[Any]:
        return list(self.records[rid])

    def host_times(self, rid: int) -> dict[str, tuple[float | None, float | None]]:
        return {h: (t[0], t[1]) for h, t in self.times[rid].items()}

    def unfinished(self) -> list[Any]:
        return [r for _, r in sorted(self.rollouts.items()) if r.status.value == "running"]

    def latest(self) -> Any:
        return self.rollouts[max(self.rollouts)] if self.rollouts else None

    def recent(self, limit: int, group: str | None = None) -> list[Any]:
        newest = [r for _, r in sorted(self.rollouts.items(), reverse=True) if group in (None, r.group)]
        return newest[:limit]


class FakeTuneStore:
    """ports.TuneStore in memory."""

    def __init__(self) -> None:
        self.runs: dict[int, Any] = {}
        self.result_rows: dict[int, dict[str, Any]] = {}

    def create(self, host: str, model: str, settings: dict[str, Any], previous_revision: int | None, at: float) -> Any:
        from orchestrator.core.tune_records import RUNNING, TuneRun

        run_id = len(self.runs) + 1
        self.runs[run_id] = TuneRun(run_id, host, model, at, dict(settings), previous_revision, RUNNING, None, None)
        self.result_rows[run_id] = {}
        return self.runs[run_id]

    def record(self, r: Any) -> None:
        self.result_rows[r.run_id][r.candidate] = r

    def finish(self, run_id: int, state: str, at: float, result: dict[str, Any] | None) -> None:
        self.runs[run_id] = replace(self.get(run_id), state=state, ended_at=at, result=result)

    def get(self, run_id: int) -> Any:
        if run_id not in self.runs:
            raise StateError(f"tune run #{run_id} does not exist in memory")
        return self.runs[run_id]

    def unfinished(self, host: str) -> Any:
        running = [r for r in self.runs.values() if r.host == host and r.state == "running"]
        return running[-1] if running else None

    def finished(self, host: str, limit: int = 10) -> list[Any]:
        done = [r for r in self.runs.values() if r.host == host and r.state == "done" and r.result is not None]
        return sorted(done, key=lambda r: -r.id)[:limit]

    def results(self, run_id: int) -> list[Any]:
        return sorted(self.result_rows[run_id].values(), key=lambda r: r.at)
