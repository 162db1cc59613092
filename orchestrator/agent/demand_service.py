"""Models on demand, the agent's part that runs: the broker's two loops and the demand socket, up
while the catalog has a model on demand. The agent syncs it at start and after each `config push`:
a push that adds the first on-demand model starts them, one that removes the last stops them (the
requests still held are answered 503), one that moves `[proxy] demand_socket` reopens the socket.
A push that changes what a host's proxy holds for (which served names, their engines and bounds, the
socket) re-renders that proxy at once (``reroute``): the next request for a new on-demand model is held.
What it does to a host's proxy (reroute, proxy_up, proxy_off, leftover_proxy_off) are operations of the
table (contract/ops.py), run through it."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from orchestrator import logs, unix_sockets
from orchestrator.agent.controller import own_hosts
from orchestrator.agent.demand import Broker
from orchestrator.agent.demand_server import PROXY_USER, DemandServer, check_reachable
from orchestrator.agent.loops import Failures, Loop
from orchestrator.contract.operation import Operation
from orchestrator.contract.ops import LEFTOVER_PROXY_OFF, PROXY_OFF, PROXY_UP, REROUTE
from orchestrator.contract.sides import Caller
from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import DemandRoute, demand_routes, host_body_limit
from orchestrator.core.watch import stall_limit
from orchestrator.deploy.operations import Operations
from orchestrator.errors import AgentError, ConfigError, OrchestratorError
from orchestrator.ports import Clock

log = logs.get_logger()

JOIN_S = 10.0  # a stopped loop ends its pass within this (a pass holds the broker's lock briefly)


class ServiceAgent(Protocol):
    """What the service needs of the agent (agent/daemon.Agent)."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def ops(self) -> Operations: ...


def held_for(catalog: Catalog, host: str) -> tuple[tuple[DemandRoute, ...], str, int]:
    """What ``host``'s proxy config holds requests for: its on-demand names (engine, bound), the socket
    the hold asks and the Retry-After it answers (nothing when no model there is on demand)."""
    if not catalog.proxy.enabled or host not in catalog.hosts:
        return (), "", 0
    routes = tuple(demand_routes(catalog, host))
    return (routes, catalog.demand_socket(), catalog.proxy.retry_after_s) if routes else ((), "", 0)


def _account(catalog: Catalog) -> tuple[str, str]:
    """HAProxy's (user, group) the demand socket is made for: [proxy] user and group, else Debian's haproxy."""
    return catalog.proxy.user or PROXY_USER, catalog.proxy.run_group or PROXY_USER


def rendered_from(catalog: Catalog, host: str) -> tuple[object, ...]:
    """Everything of ``catalog`` that ``host``'s proxy (its haproxy.cfg and its unit) is rendered from,
    beside the serving set: [proxy] whole, the bind it falls back through, the on-demand holds and the
    body routing reads (from the host's max_model_len)."""
    if not catalog.proxy.enabled or host not in catalog.hosts:
        return ()
    return (
        catalog.proxy,
        catalog.hosts[host].bind,
        catalog.defaults.bind,
        held_for(catalog, host),
        host_body_limit(catalog, host),
    )


def _box_op(spec: Operation[Any, dict[str, Any]], ops: Operations, host: str, reason: str) -> dict[str, Any]:
    """One of the agent's own box operations (contract/ops.py, Who.AGENT) on ``host``, parsed against
    ``ops``' catalog and run on them as the table says, here and now (under the host's lock)."""
    return spec.in_process(ops, spec.parse(ops.catalog, {"host": host, "reason": reason}), Caller(trigger="agent"))


class DemandService:
    def __init__(self, agent: ServiceAgent, broker: Broker, clock: Clock, failures: Failures) -> None:
        self.agent = agent
        self.broker = broker
        self.clock = clock
        self.failures = failures
        self.loops: list[Loop] = []  # running now (the agent's watchdog checks them with its own)
        self.server: DemandServer | None = None
        self.path: str | None = None  # where the socket listens
        self.account: tuple[str, str] | None = None  # HAProxy's (user, group) the socket was made for
        self._halt = threading.Event()  # the running loops' own stop (set with the agent's, too)
        self._lock = threading.Lock()

    @staticmethod
    def wanted(catalog: Catalog) -> bool:
        return any(m.on_demand for m in catalog.models.values())

    def sync(self, *, loops: bool = True) -> None:
        """Bring the socket (and, with ``loops``, the loops) in line with the agent's catalog.
        AgentError naming the socket when it cannot be opened (the loops are not started then)."""
        catalog = self.agent.catalog
        with self._lock:
            if not self.wanted(catalog):
                self._stop("no model is on demand any more")
                return
            path = catalog.demand_socket()
            # a new [proxy] user or group: the socket's group and the uids let in are made at its opening
            if self.server is not None and (self.path, self.account) != (path, _account(catalog)):
                self._close_socket()
            if self.server is None:
                self._open(path)
            if loops and not self.loops and not self.agent.stopping.is_set():
                self._start_loops()

    def precheck(self, catalog: Catalog) -> None:
        """Before a push takes ``catalog``: ConfigError when its [proxy] user could not reach the socket
        the push would open (so the push changes nothing)."""
        proxy = catalog.proxy
        if self.wanted(catalog) and proxy.user is not None:
            check_reachable(catalog.demand_socket(), proxy.user, proxy.run_group or proxy.user, planned=True)

    def reroute(self, before: Catalog, before_ops: Operations) -> dict[str, str]:
        """After a push from ``before`` (run by ``before_ops``): re-render the proxy of each host this
        agent owns whose proxy is rendered from anything the push changed (a [proxy] setting as much as
        a hold: none waits for the host's next apply), start it where the push enabled it, stop and
        disable it where the push set [proxy] enabled = false. Host -> what happened; a proxy that could
        not be reloaded keeps its old config (it takes the new one at the host's next switch, stop or
        idle sleep) and says why."""
        catalog, out = self.agent.catalog, {}
        for host in own_hosts(catalog):
            was, now = rendered_from(before, host), rendered_from(catalog, host)
            if was == now:
                continue
            if not now:
                out[host] = self._proxy_off(before_ops, host)
                continue
            try:
                changed = _box_op(
                    REROUTE, self.agent.ops, host, "config push" if was else "config push: [proxy] enabled"
                )["reloaded"]
                out[host] = ("reloaded" if was else "started") if changed else "unchanged"
            except OrchestratorError as exc:
                out[host] = (
                    f"not reloaded: {exc}; it holds the new on-demand set from the host's next "
                    "switch, stop or idle sleep (or the one running now, which routes with this file)"
                )
                log.warning("demand_reroute_failed", host=host, error=str(exc))
        return out

    @staticmethod
    def _proxy_off(ops: Operations, host: str) -> str:
        """Stop ``host``'s proxy for a push that disabled it (``ops`` of the catalog that had it)."""
        try:
            stopped = _box_op(PROXY_OFF, ops, host, "config push: [proxy] enabled = false")["was_running"]
        except OrchestratorError as exc:
            log.warning("proxy_stop_failed", host=host, error=str(exc))
            return (
                f"not stopped: {exc}; it still serves its last config until `systemctl disable --now "
                "orchestrator-proxy.service` on the host, or a push of [proxy] enabled = true takes it back"
            )
        return (
            "stopped: [proxy] enabled = false (orchestrator-proxy.service stopped and disabled); clients "
            "reach each model on its own port"
            if stopped
            else "not running: [proxy] enabled = false"
        )

    def settle_disabled_proxies(self) -> dict[str, str]:
        """At the agent's start: each host it owns whose [proxy] is off has no proxy unit left running
        or enabled from before (it would serve a stale routing table on the port). Host -> what was
        done; a host that could not be settled is logged and left (the agent starts regardless)."""
        catalog, out = self.agent.catalog, dict[str, str]()
        if catalog.proxy.enabled:
            return out
        for host in own_hosts(catalog):
            try:
                done = _box_op(LEFTOVER_PROXY_OFF, self.agent.ops, host, "agent start: [proxy] enabled = false")["done"]
            except OrchestratorError as exc:
                log.warning("proxy_stop_failed", host=host, error=str(exc))
                continue
            if done is not None:
                log.info("proxy_stopped", host=host, detail=done)
                out[host] = done
        return out

    def start_proxies(self) -> dict[str, str]:
        """At the agent's start: each host it owns with [proxy] on has its proxy up before any switch
        (the port answers: 503 "not loaded" for the catalog's names, 404 for others). Host -> what was
        done; a host that could not be brought up is logged and left (its next switch tries again)."""
        catalog, out = self.agent.catalog, dict[str, str]()
        if not catalog.proxy.enabled:
            return out
        for host in own_hosts(catalog):
            try:
                if _box_op(PROXY_UP, self.agent.ops, host, "agent start")["changed"]:
                    out[host] = "started or reloaded"
            except OrchestratorError as exc:
                log.warning("proxy_start_failed", host=host, error=str(exc))
        return out

    def halt(self) -> None:
        """The agent stops: the loops end their pass and stop (the socket stays for ``stop``)."""
        self._halt.set()

    def stop(self) -> None:
        """Loops and socket down, the requests still held answered (the agent's last step)."""
        with self._lock:
            self._stop("the agent is stopping")

    # -- the parts ---------------------------------------------------------------------------------
    def _open(self, path: str) -> None:
        proxy = self.agent.catalog.proxy
        user, group = _account(self.agent.catalog)
        try:
            server = DemandServer(path, self.broker, user=user, group=group)
        except OSError as exc:
            raise AgentError(f"the demand socket {path} ([proxy] demand_socket) cannot be opened: {exc}") from exc
        if proxy.user is not None:  # HAProxy's workers drop to it: they must reach the socket
            try:
                check_reachable(path, user, group)
            except ConfigError:
                server.server_close()
                unix_sockets.remove(server.bound)
                raise
        threading.Thread(target=server.serve_forever, name="demand-socket", daemon=True).start()
        self.server, self.path, self.account = server, path, (user, group)
        log.info("demand_socket_listening", socket=path)

    def _start_loops(self) -> None:
        self._halt = threading.Event()
        if self.agent.stopping.is_set():
            self._halt.set()
        self.loops = [
            Loop(
                "demand",
                self.broker.tick,
                stopping=self._halt,
                clock=self.clock,
                failures=self.failures,
                limit_s=stall_limit(1.0),
                retry_s=0.5,
                wake=self.broker.wake,
            ),
            Loop(
                "demand_idle",
                self.broker.idle_tick,
                stopping=self._halt,
                clock=self.clock,
                failures=self.failures,
                limit_s=stall_limit(1.0),
            ),
        ]
        for loop in self.loops:
            loop.start()
        log.info("demand_loops_started")

    def _stop(self, why: str) -> None:
        self._halt.set()
        self.broker.wake.set()  # the demand loop waits on it
        for loop in self.loops:
            if loop.thread.is_alive():
                loop.thread.join(JOIN_S)
        if self.loops:
            log.info("demand_loops_stopped", why=why)
        self.loops = []
        self._close_socket()
        self.broker.release(why)

    def _close_socket(self) -> None:
        server, path = self.server, self.path
        if server is None or path is None:
            return
        server.shutdown()
        server.server_close()
        unix_sockets.remove(server.bound)
        self.server, self.path, self.account = None, None, None
        log.info("demand_socket_closed", socket=path)
