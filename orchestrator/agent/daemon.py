"""`orchestrator agent`: the long-running daemon (control socket, schedules, watch, metrics)."""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import sdnotify

from orchestrator import logs, settings, unix_sockets
from orchestrator.agent.config_ops import ConfigRevisions
from orchestrator.agent.controller import FleetController, own_hosts
from orchestrator.agent.demand import Broker
from orchestrator.agent.demand_service import DemandService
from orchestrator.agent.loadout import Loadout, build
from orchestrator.agent.loops import Failures, Loop, dead
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.server import _DONE, ControlServer, Job, Jobs, authorized
from orchestrator.agent.tasks import ScheduleTask, WatchTask
from orchestrator.agent.tune_jobs import TuneJobs
from orchestrator.contract.operation import Operation
from orchestrator.contract.ops import lookup
from orchestrator.contract.sides import Caller
from orchestrator.contract.wire import socket_path
from orchestrator.core.catalog import Catalog
from orchestrator.core.documents import DocumentError, toml_document
from orchestrator.core.privilege import root_only_changes, unread_paths
from orchestrator.core.resident import residency_series
from orchestrator.core.watch import stall_limit
from orchestrator.deploy.operations import Operations
from orchestrator.errors import AgentError, Busy, UsageError
from orchestrator.ports import Clock

log = logs.get_logger()


def _system_clock() -> Clock:
    from orchestrator.adapters.clock import SystemClock

    return SystemClock()


class Agent:
    def __init__(
        self,
        catalog: Catalog,
        ops: Operations,
        *,
        socket: str | None = None,
        metrics_port: int | None = 9464,
        clock: Clock | None = None,
        config_path: str | None = None,
        ops_factory: Callable[[Catalog], Operations] | None = None,
    ) -> None:
        self.catalog = catalog
        self.ops = ops
        self.group = catalog.socket_group
        self.socket = socket or socket_path(catalog.state_dir)
        self.clock = clock or _system_clock()
        self.stopping = threading.Event()
        self.jobs = Jobs(ops, self._finished)
        self._metrics_lock = threading.Lock()
        self.metrics = Metrics(metrics_port)
        self.notifier = sdnotify.SystemdNotifier()
        loaded = build(catalog, self.clock.now(), template=ops.template)  # ConfigError: exit 2, before the socket
        self.failures = Failures(self.clock, ops.record_event, self.metrics)
        self.scheduler = ScheduleTask(catalog, ops, self.clock, self._submit, loaded.next_runs)
        self.watch = WatchTask(catalog, ops, self.clock, self._submit, self.jobs.busy, self.metrics, self.failures)
        self.loops = [
            Loop(
                "schedules",
                self.scheduler.tick,
                stopping=self.stopping,
                clock=self.clock,
                failures=self.failures,
                limit_s=stall_limit(30.0),
            ),
            Loop(
                "watch",
                self.watch.tick,
                stopping=self.stopping,
                clock=self.clock,
                failures=self.failures,
                limit_s=stall_limit(catalog.policy.watch_interval_s),
            ),
        ]
        # Models on demand: the broker answers the front proxy's held requests (agent/demand.py); its
        # loops and socket run while the catalog has an on-demand model (synced at start and on push).
        self.broker = Broker(self, self.clock)
        self.demand = DemandService(self, self.broker, self.clock, self.failures)
        self.reported_dead: list[str] = []
        # config show/push need the file the agent was started from; revisions live in its state.db
        self.configs = (
            ConfigRevisions(config_path, catalog.state_dir, group=catalog.socket_group) if config_path else None
        )
        self.config_revision = self.configs.record_if_new("agent start") if self.configs else None
        self.ops_factory = ops_factory
        self._last_validated: tuple[tuple[str, str, int], Loadout] | None = None  # see _validated
        self.dashboard_socket: str | None = None  # where the dashboard serves, once started (status says)
        # rollouts this agent runs as its fleet's controller (agent/controller.py); test entry points
        # may replace it before run()
        self.controller = FleetController(
            lambda: self.catalog, clock=self.clock, pid=os.getpid(), stopping=self.stopping
        )
        # tune runs, each a job of its model's host (agent/tune_jobs.py)
        self.tuner = TuneJobs(
            self.jobs, lambda: self.ops, lambda: self.configs.path if self.configs else None, self.stopping
        )

    # -- life cycle -----------------------------------------------------------------------------
    def run(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        signal.signal(signal.SIGINT, lambda *_: self.stop())
        self.metrics.start()
        server = ControlServer(self.socket, self)
        threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
        dashboard = self._start_dashboard()
        self.demand.sync(loops=False)  # the socket before READY, the loops with the others
        self.demand.settle_disabled_proxies()  # [proxy] off in the file: no proxy left up from before
        self.demand.start_proxies()  # [proxy] on: its port answers before the first switch
        log.info("agent_started", socket=self.socket, hosts=list(self.catalog.hosts))
        tuning = self.tuner.resume_unfinished(own_hosts(self.catalog))  # each recovers its own host first
        for host in own_hosts(self.catalog):  # reconcile what a crash left unfinished, before anything new
            if host not in tuning and self.ops.unfinished(host):
                self._submit("recover", {"host": host}, "recover")
        self.controller.resume_unfinished()  # a controller that restarted drives its rollouts again
        self.notifier.notify("READY=1")
        self._refresh_metrics()
        for loop in self.loops:
            loop.start()
        self.demand.sync()
        watchdog = float(os.environ.get("WATCHDOG_USEC", "0")) / 1e6
        while not self.stopping.wait(watchdog / 2 if watchdog else 1.0):
            if self.loops_healthy() and watchdog:
                self.notifier.notify("WATCHDOG=1")
        self.notifier.notify("STOPPING=1")
        log.info("agent_stopping", running=[j.host for j in list(self.jobs.running.values())])
        self.ops.park_all()  # each running step finishes or parks; the next start resumes it
        self.jobs.join(timeout=120)
        server.shutdown()
        server.server_close()
        if dashboard is not None:
            dashboard.close()
        self.demand.stop()
        unix_sockets.remove(server.bound)
        log.info("agent_stopped")

    def _start_dashboard(self) -> Any:
        from orchestrator.dashboard.service import start

        server = start(self)
        self.dashboard_socket = None if server is None else str(server.server_address)
        return server

    def loops_healthy(self) -> bool:
        """True while every loop makes progress. A dead one is reported once; the caller then stops
        the watchdog pings, and systemd restarts the agent (WatchdogSec in its unit)."""
        now_dead = dead([*self.loops, *self.demand.loops], self.clock)
        self.metrics.dead_loops(len(now_dead))
        if now_dead and now_dead != self.reported_dead:
            log.error("agent_loop_dead", loops=now_dead, action="watchdog pings withheld")
            self.failures.record(None, "loop_dead", {"loops": now_dead})
        self.reported_dead = now_dead
        return not now_dead

    def stop(self) -> None:
        self.stopping.set()
        self.demand.halt()

    def authorized(self, uid: int, gid: int) -> bool:
        return authorized(uid, gid, self.group)

    # -- requests ---------------------------------------------------------------------------------
    def dispatch(
        self, op: object, raw_args: object, caller: str, *, uid: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Answer one client request from the operation table (contract/ops.py); ``caller`` (user@socket
        or user@ssh-client, from the peer's uid and the box's view of its login) is the trigger, never
        what the client says; ``uid`` is the peer's (None: unknown, so never root)."""
        spec = lookup(op)
        args = spec.parse(self.catalog, raw_args)
        spec.admit(self, args, Caller(trigger=caller, uid=uid))
        if spec.job is not None:
            yield from self._stream(self._start(spec, args, caller))
        elif spec.stream is not None:
            yield from spec.stream(self, args)
        else:
            yield {
                "result": spec.in_agent(self, args, Caller(trigger=caller, uid=uid, next_runs=self.scheduler.next_runs))
            }

    def _submit(self, op: str, raw_args: dict[str, Any], trigger: str) -> Job:
        """Start a job of the agent's own (schedules, watch, recovery), validated like a client's."""
        spec = lookup(op)
        return self._start(spec, spec.parse(self.catalog, raw_args), trigger)

    def _start(self, spec: Operation[Any, Any], args: Any, trigger: str) -> Job:
        if self.stopping.is_set():
            raise AgentError("the agent is stopping; try again when it is back")
        assert spec.job is not None
        # one host per job: recover without --on on several hosts is refused, naming them
        host = args.on if args.on is not None else self.catalog.only_host().name
        # Operators first: an on-demand swap running on the host is waited for (no new one starts meanwhile).
        self.broker.yield_to(host, f"{spec.name} by {trigger}", timeout_s=self._yield_s(host))
        try:
            return self.jobs.submit(
                host,
                spec.name,
                args.model_dump(),
                lambda job: spec.in_process(self.ops, args, Caller(progress=self._publisher(job), trigger=trigger)),
            )
        finally:
            self.broker.resume(host)

    def _yield_s(self, host: str) -> float:
        """The longest an operation waits for an on-demand swap on ``host``: its longest cold start."""
        deadlines = [
            self.catalog.demand_deadline(n, cold=True)
            for n in self.catalog.models_on(host)
            if self.catalog.models[n].on_demand
        ]
        return max(deadlines, default=0.0) + 60.0 if deadlines else 0.0

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

    # -- what only the agent answers (contract.sides.AgentSide) ---------------------------------------
    def info(self) -> dict[str, Any]:
        out = {
            "pid": os.getpid(),
            "running": {h: j.op for h, j in list(self.jobs.running.items())},
            "dashboard": self.dashboard_socket,
        }
        if any(m.on_demand for m in self.catalog.models.values()):
            out["demand"] = self.broker.snapshot()
        return out

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return rows if self.configs is None else self.configs.annotate(rows)

    def follow(self, host: str | None) -> Iterator[dict[str, Any]]:
        jobs = [j for h, j in list(self.jobs.running.items()) if host in (None, h)]
        for job in jobs:
            q = job.listen()  # before saying so: nothing published after "following" is missed
            running = self.ops.unfinished(job.host)
            yield {
                "event": "following",
                "fields": {
                    "host": job.host,
                    "op": job.op,
                    "what": " ".join(str(v) for v in job.args.values() if v),
                    "phase": running[-1].phase.value if running else None,
                    "revision": running[-1].revision if running else None,
                },
            }
            for item in self._stream(job, q):
                if "event" in item:
                    yield item
        yield {"result": {"followed": [j.host for j in jobs]}}

    # -- configuration ----------------------------------------------------------------------------
    def _configs(self) -> ConfigRevisions:
        if self.configs is None:
            raise UsageError("this agent was started without a config file: nothing to show or replace")
        return self.configs

    def config_show(self) -> dict[str, Any]:
        return self._configs().show()

    def config_push(self, text: str, name: str | None, caller: Caller) -> dict[str, Any]:
        return self._push(self._configs(), text, name or "pushed file", caller.trigger or "unknown")

    def root_only_changes(self, text: str, name: str | None) -> list[str]:
        """What ``text`` changes that only root may (core.privilege): the table's rule for config push."""
        try:  # model files named anew: refused before validation reads them as root
            early = unread_paths(
                toml_document(self._configs().show()["text"], "deploy.toml"), toml_document(text, name or "pushed file")
            )
        except DocumentError:
            early = []  # validation names what is wrong with the text
        if early:
            return early
        return root_only_changes(
            self.catalog, self._validated(text, name or "pushed file").catalog, shipped=str(settings.SHIPPED_CONFIGS)
        )

    def _validated(self, text: str, name: str) -> Loadout:
        """``text`` validated as at start; the last one is kept, so the table's root check and the push
        that follows it validate once."""
        key = (text, name, id(self.catalog))
        last = self._last_validated
        if last is None or last[0] != key:
            last = (
                key,
                self._configs().validate(text, name, self.catalog, now=self.clock.now(), template=self.ops.template),
            )
            self._last_validated = last
        return last[1]

    def _push(self, configs: ConfigRevisions, text: str, name: str, operator: str) -> dict[str, Any]:
        """Validate as at start (the table checked the caller may make these changes), then (between
        operations) replace the file and reload the catalog."""
        from orchestrator.wiring import operations

        previous, before, before_ops = configs.show(), self.catalog, self.ops
        loaded = self._validated(text, name)
        self._last_validated = None
        ops = (self.ops_factory or operations)(loaded.catalog)  # anything that can fail, before the write
        self.demand.precheck(loaded.catalog)  # HAProxy's user can reach the demand socket it would open
        with self.jobs.lock:  # no operation starts while the catalog is swapped
            if self.jobs.running:
                running = ", ".join(f"{j.op} on {h}" for h, j in self.jobs.running.items())
                raise Busy(
                    f"config push refused: an operation is running ({running}); nothing was changed: "
                    "push again once it ends (`orchestrator status --follow` shows when)"
                )
            revision = configs.replace(text, operator)
            self._swap(loaded, ops)
            self.config_revision = revision
        log.info("config_pushed", revision=revision, operator=operator, file=str(configs.path))
        self.demand.sync()  # on demand's loops and socket follow the file (outside the jobs' lock)
        proxies = self.demand.reroute(before, before_ops)  # then the proxies hold for it (the socket answers by now)
        return {
            "path": str(configs.path),
            "revision": revision,
            "previous_revision": previous["revision"],
            "changed": previous["sha256"] != configs.show()["sha256"],
            **({"proxy": proxies} if proxies else {}),
        }

    def _swap(self, loaded: Loadout, ops: Operations) -> None:
        """Put a pushed file's loadout in place (nothing here can fail: it was all built before)."""
        catalog = loaded.catalog
        self.catalog, self.ops, self.jobs.ops, self.group = catalog, ops, ops, catalog.socket_group
        self.scheduler.reload(catalog, ops, loaded.next_runs)
        self.watch.catalog, self.watch.ops = catalog, ops

    # -- background work --------------------------------------------------------------------------
    def _finished(self, job: Job) -> None:
        result = (job.result or {}).get("result") or {}
        if (
            self.configs is not None
            and self.config_revision is not None
            and isinstance(result, dict)
            and isinstance(result.get("id"), int)
        ):
            self.configs.link(result["id"], self.config_revision)
        if isinstance(result, dict) and result.get("outcome"):
            self.metrics.deployment(job.host, str(result["outcome"]), result.get("phases") or [])
        self._refresh_metrics()

    def _refresh_metrics(self) -> None:
        with self._metrics_lock:  # jobs of two hosts end at once: a refresh that read first never writes last
            self._refresh_metrics_now()

    def _refresh_metrics_now(self) -> None:
        for host in own_hosts(self.catalog):
            serving = self.ops.serving(host)
            self.metrics.active(host, serving.model if serving else None, serving.revision if serving else None)
            self.metrics.residency(
                host,
                residency_series(
                    {n: self.catalog.models[n].sleep for n in self.catalog.models_on(host)},
                    {d.model for d in self.ops.store.serving_set(host)} | ({serving.model} if serving else set()),
                    self.ops.residency.residency(host),
                ),
            )


__all__ = ["Agent"]
