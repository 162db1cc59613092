"""`orchestrator agent`: the long-running daemon (control socket, schedules, watch, metrics)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sdnotify
import structlog

from orchestrator.agent.config_ops import ConfigRevisions
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.protocol import error_reply
from orchestrator.agent.server import _DONE, ControlServer, Job, Jobs, authorized
from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Catalog
from orchestrator.deploy.operations import Operations
from orchestrator.errors import Busy, OrchestratorError, UsageError

log = structlog.get_logger()


def socket_path(catalog: Catalog) -> str:
    return os.environ.get("ORCHESTRATOR_SOCKET") or str(Path(catalog.state_dir) / "agent.sock")


class Agent:
    def __init__(self, catalog: Catalog, ops: Operations, *, socket: str | None = None,
                 metrics_port: int | None = 9464, config_path: str | None = None,
                 ops_factory: Callable[[Catalog], Operations] | None = None) -> None:
        self.catalog = catalog
        self.ops = ops
        self.group = catalog.socket_group
        self.socket = socket or socket_path(catalog)
        self.stopping = threading.Event()
        self.jobs = Jobs(ops, self._finished)
        self.metrics = Metrics(metrics_port)
        self.notifier = sdnotify.SystemdNotifier()
        self.next_runs: dict[str, float] = {}
        self.unhealthy_since: dict[str, float] = {}
        for s in catalog.schedules.values():
            sched.validate(s)
        # config show/push need the file the agent was started from; revisions live in its state.db
        self.configs = ConfigRevisions(config_path, catalog.state_dir) if config_path else None
        self.config_revision = self.configs.record_if_new("agent start") if self.configs else None
        self.ops_factory = ops_factory

    # -- life cycle -----------------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())
        self.metrics.start()
        server = ControlServer(self.socket, self)
        threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
        log.info("agent_started", socket=self.socket, hosts=list(self.catalog.hosts))
        for host in self.catalog.hosts:  # reconcile what a crash left unfinished, before anything new
            if self.ops.store.unfinished(host):
                self.jobs.submit(host, "recover", {}, lambda job: {"recovered": self.ops.recover(
                    job.host, progress=lambda e, f: job.publish({"event": e, "fields": f}))})
        self.notifier.notify("READY=1")
        self._refresh_metrics()
        threads = [threading.Thread(target=self._schedules, name="schedules", daemon=True),
                   threading.Thread(target=self._watch, name="watch", daemon=True)]
        for t in threads:
            t.start()
        watchdog = float(os.environ.get("WATCHDOG_USEC", "0")) / 1e6
        while not self.stopping.wait(watchdog / 2 if watchdog else 1.0):
            if watchdog:
                self.notifier.notify("WATCHDOG=1")
        self.notifier.notify("STOPPING=1")
        log.info("agent_stopping", running=[j.host for j in list(self.jobs.running.values())])
        self.ops.park_all()  # each running step finishes or parks; the next start resumes it
        self.jobs.join(timeout=120)
        server.shutdown()
        server.server_close()
        try:
            os.unlink(self.socket)
        except FileNotFoundError:
            pass
        log.info("agent_stopped")

    def stop(self) -> None:
        self.stopping.set()

    def authorized(self, uid: int, gid: int) -> bool:
        return authorized(uid, gid, self.group)

    # -- requests ---------------------------------------------------------------------------------
    def dispatch(self, op: str, args: dict[str, Any], operator: str | None = None) -> Iterator[dict[str, Any]]:
        """One request; ``operator`` is who the socket peer is (the agent's reading, never the client's)."""
        if op == "ping":
            yield {"result": {"pid": os.getpid()}}
        elif op == "status":
            yield {"result": self.status(args.get("host"))}
        elif op == "history":
            rows = self.ops.history(args.get("host"), int(args.get("limit", 50)))
            yield {"result": self.configs.annotate(rows) if self.configs else rows}
        elif op == "schedules":
            yield {"result": self.schedules()}
        elif op == "follow":
            yield from self._follow(args.get("host"))
        elif op == "config_show":
            yield {"result": self._configs().show()}
        elif op == "config_push":
            yield {"result": self._push(str(args.get("text", "")), str(args.get("name") or "pushed file"),
                                        operator or "unknown")}
        else:
            who = operator or "unknown"
            trigger = f"rollback by {who}" if op == "rollback" else f"cli:{who}"
            yield from self._stream(self._submit(op, args, trigger=trigger))

    def _submit(self, op: str, args: dict[str, Any], trigger: str | None = None) -> Job:
        if self.stopping.is_set():
            raise OrchestratorError("the agent is stopping; try again when it is back")
        if op == "switch":
            model = str(args["model"])
            host = self.ops._host_of(model)
            return self.jobs.submit(host, op, args, lambda job: self.ops.switch(
                model, trigger=trigger, no_rollback=bool(args.get("no_rollback")),
                force=bool(args.get("force")), progress=self._publisher(job)))
        if op == "rollback":
            host = args.get("host") or self.ops._only_host()
            return self.jobs.submit(host, op, args, lambda job: self.ops.rollback(
                host, args.get("to_revision"), trigger=trigger or "rollback", progress=self._publisher(job)))
        if op == "recover":
            host = args.get("host") or self.ops._only_host()
            return self.jobs.submit(host, op, args, lambda job: {"recovered": self.ops.recover(
                host, progress=self._publisher(job))})
        if op == "stage":
            model = str(args["model"])
            peer = args.get("peer")
            if peer is not None and not isinstance(peer, dict):
                raise UsageError(f"stage: peer must be an object, got {type(peer).__name__}")
            return self.jobs.submit(self.ops._host_of(model), op, args,
                                    lambda job: self.ops.stage(model, peer=peer, progress=self._publisher(job)))
        raise UsageError(f"unknown operation {op!r}")

    @staticmethod
    def _publisher(job: Job) -> Any:
        return lambda event, fields: job.publish({"event": event, "fields": fields})

    def _stream(self, job: Job, q: queue.Queue[Any] | None = None) -> Iterator[dict[str, Any]]:
        q = q or job.listen()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    break
                yield item
        finally:
            job.unlisten(q)
        assert job.result is not None
        yield job.result

    def _follow(self, host: str | None) -> Iterator[dict[str, Any]]:
        jobs = [j for h, j in list(self.jobs.running.items()) if host in (None, h)]
        for job in jobs:
            q = job.listen()  # before saying so: nothing published after "following" is missed
            running = self.ops.store.unfinished(job.host)
            yield {"event": "following", "fields": {
                "host": job.host, "op": job.op, "what": " ".join(str(v) for v in job.args.values() if v),
                "phase": running[-1].phase.value if running else None,
                "revision": running[-1].revision if running else None}}
            for item in self._stream(job, q):
                if "event" in item:
                    yield item
        yield {"result": {"followed": [j.host for j in jobs]}}

    def status(self, host: str | None) -> dict[str, Any]:
        out = self.ops.status(host)
        out["agent"] = {"pid": os.getpid(), "running": {h: j.op for h, j in list(self.jobs.running.items())}}
        out["schedules"] = self.schedules()
        return out

    def schedules(self) -> list[dict[str, Any]]:
        return schedule_rows(self.catalog, self.ops, self.next_runs)

    # -- background work --------------------------------------------------------------------------
    # -- configuration ----------------------------------------------------------------------------
    def _configs(self) -> ConfigRevisions:
        if self.configs is None:
            raise UsageError("this agent was started without a config file: nothing to show or replace")
        return self.configs

    def _push(self, text: str, name: str, operator: str) -> dict[str, Any]:
        """Validate as at start, then (between operations) replace the file and reload the catalog."""
        configs = self._configs()
        previous = configs.show()
        catalog = configs.validate(text, name, self.catalog)
        with self.jobs.lock:  # no operation starts while the catalog is swapped
            if self.jobs.running:
                running = ", ".join(f"{j.op} on {h}" for h, j in self.jobs.running.items())
                raise Busy(f"config push waits for the running operation to end ({running}); try again then")
            revision = configs.replace(text, f"cli:{operator}")
            self._reload(catalog)
            self.config_revision = revision
        log.info("config_pushed", revision=revision, operator=operator, file=str(configs.path))
        return {"path": str(configs.path), "revision": revision, "previous_revision": previous["revision"],
                "changed": previous["sha256"] != configs.show()["sha256"]}

    def _reload(self, catalog: Catalog) -> None:
        from orchestrator.wiring import operations

        ops = (self.ops_factory or operations)(catalog)
        self.catalog, self.ops, self.jobs.ops, self.group = catalog, ops, ops, catalog.socket_group
        now = time.time()
        self.next_runs = {n: sched.next_run(s, now) for n, s in catalog.schedules.items()}

    def _finished(self, job: Job) -> None:
        result = (job.result or {}).get("result") or {}
        if self.configs is not None and self.config_revision is not None and isinstance(result, dict) \
                and isinstance(result.get("id"), int):
            self.configs.link(result["id"], self.config_revision)
        if isinstance(result, dict) and result.get("outcome"):
            self.metrics.deployment(job.host, str(result["outcome"]), result.get("phases") or [])
        self._refresh_metrics()

    def _refresh_metrics(self) -> None:
        for host in self.catalog.hosts:
            serving = self.ops.store.serving(host)
            self.metrics.active(host, serving.model if serving else None, serving.revision if serving else None)

    def _schedules(self) -> None:
        now = time.time()
        self.next_runs = {n: sched.next_run(s, now) for n, s in self.catalog.schedules.items()}
        while not self.stopping.is_set():
            now = time.time()
            for name, at in sorted(self.next_runs.items(), key=lambda kv: kv[1]):
                if at <= now and name in self.catalog.schedules:  # a pushed config may have dropped it
                    self._fire(name, at)
                    self.next_runs[name] = sched.next_run(self.catalog.schedules[name], max(now, at))
            wait = min(self.next_runs.values(), default=now + 60) - time.time()
            self.stopping.wait(max(0.05, min(wait, 30.0)))

    def _fire(self, name: str, at: float) -> None:
        s = self.catalog.schedules[name]
        host = s.host or (self.catalog.model_host(s.model).name if s.model else self.ops._only_host())
        detail: dict[str, Any] = {"schedule": name, "action": s.action, "model": s.model, "due": at}
        if not sched.in_window(s, time.time()):
            self.ops.store.record_event(time.time(), host, "schedule_skipped", {**detail, "reason": "outside window"})
            return
        try:
            if s.action == "redeploy":
                serving = self.ops.store.serving(host)
                if serving is None:
                    raise UsageError(f"host {host} serves nothing to redeploy")
                job = self._submit("switch", {"model": serving.model, "force": True}, trigger=f"schedule:{name}")
            else:
                job = self._submit(s.action, {"model": s.model}, trigger=f"schedule:{name}")
        except OrchestratorError as exc:
            self.ops.store.record_event(time.time(), host, "schedule_skipped", {**detail, "reason": str(exc)})
            log.info("schedule_skipped", schedule=name, host=host, reason=str(exc))
            return
        self.ops.store.record_event(time.time(), host, "schedule_fired", detail)
        log.info("schedule_fired", schedule=name, host=host, op=job.op)

    def _watch(self) -> None:
        policy = self.catalog.policy
        while not self.stopping.wait(policy.watch_interval_s):
            for host in self.catalog.hosts:
                if self.jobs.busy(host):
                    continue
                serving = self.ops.store.serving(host)
                if serving is None:
                    continue
                healthy = self.ops.engine().is_healthy(serving)
                self.metrics.healthy(host, healthy)
                if healthy:
                    self.unhealthy_since.pop(host, None)
                    continue
                since = self.unhealthy_since.setdefault(host, time.time())
                if time.time() - since < policy.unhealthy_after_s:
                    continue
                self.unhealthy_since.pop(host, None)
                detail = {"model": serving.model, "revision": serving.revision, "action": policy.on_unhealthy,
                          "unhealthy_s": round(time.time() - since, 1)}
                self.ops.store.record_event(time.time(), host, "unhealthy", detail)
                log.warning("model_unhealthy", host=host, **detail)
                try:
                    if policy.on_unhealthy == "restart":
                        self._submit("switch", {"model": serving.model, "force": True}, trigger="watch:restart")
                    elif policy.on_unhealthy == "rollback":
                        self._submit("rollback", {"host": host}, trigger="watch:rollback")
                except OrchestratorError as exc:
                    self.ops.store.record_event(time.time(), host, "watch_action_failed", {"error": str(exc)})


def schedule_rows(catalog: Catalog, ops: Operations, next_runs: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Each schedule with its next firing time and the last thing it did."""
    now = time.time()
    events = [e for e in ops.store.events(limit=500) if e.get("schedule")]
    rows = []
    for name, s in catalog.schedules.items():
        nxt = (next_runs or {}).get(name) or sched.next_run(s, now)
        last = next((e for e in events if e["schedule"] == name), None)
        rows.append({"name": name, "cron": s.cron, "action": s.action, "model": s.model, "window": s.window,
                     "next_run": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(nxt)), "next_run_ts": nxt,
                     "last": last})
    return rows


__all__ = ["Agent", "error_reply", "socket_path"]
