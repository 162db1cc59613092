"""The front proxy, pure: the routes of a host and the HAProxy config that serves them.

A host serves a set of models on disjoint GPU sets behind one endpoint. A route is a served name
(the request's ``model``) pointing at one engine, or a gap (503 + Retry-After while it restarts).
How a switch changes which models serve: core/switch_plan.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.core.catalog import Catalog, Proxy
from orchestrator.core.haproxy_cli import MARK
from orchestrator.core.records import UnitSpec
from orchestrator.core.render import engine_address
from orchestrator.core.templating import compiled
from orchestrator.engines import ENGINES
from orchestrator.errors import RenderError

# Every engine's control endpoints (sleep, wake_up, collective_rpc ...), never forwarded to any backend.
ENGINE_CONTROL_PATHS = tuple(dict.fromkeys(p for e in ENGINES.values() for p in e.control_paths))


@dataclass(frozen=True)
class Route:
    name: str
    address: str | None = None  # None: a gap, answered 503 + Retry-After
    port: int | None = None
    loading: bool = False  # a gap for a name nothing served before: "is loading", not "is being switched"

    @property
    def target(self) -> str:
        if self.address is not None:
            return f"{self.address}:{self.port}"
        return "503 (loading)" if self.loading else "503 (switching)"


@dataclass(frozen=True)
class DemandRoute:
    """A served name on demand: while its route has no usable server a request is held (the agent
    wakes or starts the model), then sent to this engine; ``deadline_s`` bounds the hold."""

    name: str
    address: str
    port: int
    deadline_s: float


# Where the hold's Lua lives on the box: beside the config it is loaded by (the adapter writes it).
DEMAND_LUA = "demand_hold.lua"
PROXY_UNIT = "orchestrator-proxy.service"  # the one unit of a host's front proxy
# The proxy's own bound on a hold, past the agent's deadline (the agent answers its 503 first).
DEMAND_MARGIN_S = 2.0


# Routing reads the request's body for its `model`, wherever the key comes (a client that sorts keys
# sends `messages` first), so HAProxy's buffer holds the largest body a model on the host accepts:
# its max_model_len at 8 bytes a token (English text is ~4 bytes a token, JSON-escaped CJK ~6-8), plus
# the request's other fields. HAProxy's memory grows with the bytes a connection holds, not with the
# buffer's size (bench/proxy/body_memory.txt), so the margin costs nothing until a body uses it.
BODY_BYTES_PER_TOKEN = 8
BODY_MARGIN = 64 * 1024  # tools, sampling parameters, message framing
# A model without max_model_len: the engine takes its config's context, which the catalog does not read.
DEFAULT_CONTEXT_TOKENS = 262_144
MAX_BODY = 64 * 1024 * 1024  # no max_model_len makes the buffer unbounded: at most ~8M tokens
MAX_BODY_TOKENS = (MAX_BODY - BODY_MARGIN) // BODY_BYTES_PER_TOKEN
# Beside the body, the buffer holds the request's headers and HAProxy's rewrite reserve (1 KiB).
HEADER_ROOM = 32 * 1024


@dataclass(frozen=True)
class BodyLimit:
    """How much of a request's body the proxy reads to find its model: a longer body whose model is
    not within it is answered 413 (one that names its model early still routes)."""

    tokens: int  # the largest context of the host's models

    @property
    def bytes(self) -> int:
        return self.tokens * BODY_BYTES_PER_TOKEN + BODY_MARGIN

    @property
    def bufsize(self) -> int:
        """HAProxy's tune.bufsize: the body, its headers and the rewrite reserve."""
        return self.bytes + HEADER_ROOM


def body_limit(max_model_lens: Iterable[int | None]) -> BodyLimit:
    """The limit for models of these contexts (None: unset, the default context stands in), capped."""
    largest = max([DEFAULT_CONTEXT_TOKENS if n is None else n for n in max_model_lens], default=DEFAULT_CONTEXT_TOKENS)
    return BodyLimit(min(largest, MAX_BODY_TOKENS))


def host_body_limit(catalog: Catalog, host: str) -> BodyLimit:
    """The limit of ``host``'s proxy: every model of the catalog there, serving or not, so that a
    switch never changes it."""
    return body_limit(catalog.models[m].max_model_len for m in catalog.models_on(host))


DEFAULT_BODY = body_limit([])


def lua_path(proxy: Proxy) -> str:
    return proxy.config_path.rsplit("/", 1)[0] + "/" + DEMAND_LUA


def demand_routes(catalog: Catalog, host: str) -> list[DemandRoute]:
    """The served names on demand at ``host``, each held at most its longest (cold) deadline.
    RenderError when two models on demand share a served name (a held request could not know
    which engine its ready means)."""
    out: dict[str, DemandRoute] = {}
    for name in catalog.models_on(host):
        model = catalog.models[name]
        if not model.on_demand:
            continue
        if model.served in out:
            other = next(
                n
                for n in catalog.models_on(host)
                if catalog.models[n].on_demand and catalog.models[n].served == model.served
            )
            raise RenderError(
                f"models {other} and {name} are both on demand and served as {model.served!r} on "
                f"host {host}: a held request could not know which to start (set on_demand on one)",
                host=host,
            )
        out[model.served] = DemandRoute(
            model.served,
            engine_address(catalog, model, catalog.hosts[host]),
            model.port,
            catalog.demand_deadline(name, cold=True),
        )
    return [out[k] for k in sorted(out)]


def routes_for(serving: Iterable[UnitSpec], gaps: Iterable[str] = (), loading: Iterable[str] = ()) -> list[Route]:
    """One route per served name (a gap for names in ``gaps``; a loading gap for names in ``loading``
    that neither serve nor are gaps), sorted for a stable config."""
    gap = set(gaps)
    out = {
        s.served_name: Route(s.served_name) if s.served_name in gap else Route(s.served_name, s.address, s.port)
        for s in serving
    }
    for name in gap - set(out):
        out[name] = Route(name)
    for name in set(loading) - set(out):
        out[name] = Route(name, loading=True)
    return [out[k] for k in sorted(out)]


def _plain(value: object, what: str) -> str:
    text = str(value)
    bad = next(
        (ch for ch in text if ord(ch) < 0x20 or ord(ch) == 0x7F or unicodedata.category(ch) in ("Zl", "Zp", "Cf")), None
    )
    if bad is not None or not text:
        raise RenderError(
            f"{what} {text!r} cannot be written into HAProxy's config " + (f"(it holds {bad!r})" if bad else "(empty)")
        )
    return text


def haproxy_word(value: object) -> str:
    """``value`` as one double-quoted HAProxy argument: a space, ``#`` or quote inside it can never
    start another argument, a comment or an environment variable (defence in depth: the catalog
    already allows only addresses, paths and routable names here)."""
    text = _plain(value, "value")
    for ch in "\\\"$#'":
        text = text.replace(ch, "\\" + ch)
    return f'"{text}"'


def haproxy_addr(address: object, port: object) -> str:
    """``address:port`` as one quoted HAProxy argument; an IPv6 literal in brackets."""
    host = _plain(address, "address")
    return haproxy_word(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")


def haproxy_comment(value: object) -> str:
    """Text for a ``#`` comment line: anything that could end the line is refused."""
    return _plain(value, "comment text")


@dataclass(frozen=True)
class HostRouting:
    """What a host's front proxy must do, as data: the FrontProxy port takes it and its adapter renders
    it (``render_routing``). Its routes, the host's names on demand (held while they have no server)
    and every catalog name it knows, how much of a body routing reads, the proxy's settings and bind."""

    proxy: Proxy
    bind: str
    routes: tuple[Route, ...]
    demand: tuple[DemandRoute, ...] = ()
    demand_socket: str = ""
    known: tuple[str, ...] = ()
    body: BodyLimit = DEFAULT_BODY
    alternates: tuple[Route, ...] = ()  # every engine of the host's catalog by its served name


def host_routing(catalog: Catalog, host: str, bind: str, routes: Iterable[Route]) -> HostRouting:
    """``host``'s routing: ``routes``, and what the catalog says of its names (on demand, known, body)."""
    demand = tuple(demand_routes(catalog, host))
    return HostRouting(
        proxy=catalog.proxy,
        bind=bind,
        routes=tuple(routes),
        demand=demand,
        demand_socket=catalog.demand_socket(),
        known=tuple(sorted({catalog.models[m].served for m in catalog.models_on(host)})),
        body=host_body_limit(catalog, host),
        alternates=tuple(alternates(catalog, host)),
    )


def alternates(catalog: Catalog, host: str) -> list[Route]:
    """Every engine of ``host``'s catalog under its served name: a routed name's backend lists a server
    for each engine that may serve it (disabled but the routed one), so that a switch between them
    moves the route in the running proxy without a reload (core/proxy_move.py)."""
    out = {
        (m.served, engine_address(catalog, m, catalog.hosts[host]), m.port)
        for m in (catalog.models[n] for n in catalog.models_on(host))
    }
    return [Route(name, address, port) for name, address, port in sorted(out)]


def render_routing(routing: HostRouting, template: str, lua: str) -> str:
    """The haproxy.cfg of ``routing``, with the hold (``lua``: demand_hold.lua) for its names on demand."""
    return render_config(
        routing.proxy,
        routing.bind,
        routing.routes,
        template,
        demand=routing.demand,
        demand_socket=routing.demand_socket,
        lua=lua if routing.demand else "",
        known=routing.known,
        body=routing.body,
        alternates=routing.alternates,
    )


def render_host(catalog: Catalog, host: str, bind: str, routes: Sequence[Route], template: str, lua: str) -> str:
    """``host``'s haproxy.cfg: ``routes``, and the hold (``lua``: demand_hold.lua) for its models on demand."""
    return render_routing(host_routing(catalog, host, bind, routes), template, lua)


_FILTERS = (("q", haproxy_word), ("comment", haproxy_comment))
_HELPERS = (("addr", haproxy_addr),)


def render_config(
    proxy: Proxy,
    bind: str,
    routes: Sequence[Route],
    template: str,
    *,
    demand: Sequence[DemandRoute] = (),
    demand_socket: str = "",
    lua: str = "",
    known: Sequence[str] = (),
    body: BodyLimit = DEFAULT_BODY,
    alternates: Sequence[Route] = (),
) -> str:
    """The haproxy.cfg routing ``routes``; names in ``demand`` are held while they have no usable
    server (``demand_socket``: the agent's; ``lua``: the hold's source, whose hash the config
    carries so a new one reloads the proxy). ``known``: the host's catalog names; one that neither
    routes nor is held answers 503 "not loaded", so 404 means a name the host does not know.
    ``body``: how much of a body routing reads. ``alternates``: engines that may serve a name, each a
    disabled server of its backend beside the routed one (a move between them needs no reload)."""
    if demand and not (demand_socket and lua):
        raise RenderError("models on demand need the agent's demand socket and the hold's Lua to render the proxy")
    served = [r for r in routes if r.address is not None]
    on_demand = {d.name: d for d in demand}
    by_name = {r.name: r for r in served}
    # One backend per name that routes: served ones, and names on demand wherever they are, numbered
    # in the names' order: a name on demand keeps its backend's name whether it serves or not, so a
    # swap between such names changes server states alone (a runtime move: core/proxy_move.py).
    others: dict[str, set[tuple[str, int]]] = {}
    for alt in alternates:
        if alt.address is not None and alt.port is not None:
            others.setdefault(alt.name, set()).add((alt.address, alt.port))
    backends = [
        _Backend(f"m{i}", name, by_name.get(name), on_demand.get(name), tuple(sorted(others.get(name, ()))))
        for i, name in enumerate(sorted(set(by_name) | set(on_demand)), 1)
    ]
    models = {
        "object": "list",
        "data": [{"id": b.name, "object": "model", "owned_by": "orchestrator"} for b in backends],
    }
    # A request held for a model on demand lives in the worker that took it, through reloads: an old
    # worker may not be ended (hard-stop-after) before the longest hold.
    stop_after_s = max([proxy.drain_timeout_s, *(int(b.hold_s) for b in backends if b.demand)])
    # Single-quoted in the config, where HAProxy interprets nothing: a quote in a name is \u0027 JSON.
    models_json = json.dumps(models, separators=(",", ":")).replace("'", "\\u0027")
    return compiled(template, filters=_FILTERS, helpers=_HELPERS).render(
        routes=routes,
        backends=backends,
        engine_control=ENGINE_CONTROL_PATHS,
        bind=bind,
        gaps=[r for r in routes if r.address is None and r.name not in on_demand and not r.loading],
        loading=[r for r in routes if r.loading and r.name not in on_demand],
        idle=sorted(set(known) - {r.name for r in routes} - set(on_demand)),
        demand_socket=demand_socket,
        lua_path=lua_path(proxy),
        lua_sha=sha(lua) if demand else "",
        port=proxy.port,
        stats_socket=proxy.stats_socket,
        drain_timeout_s=f"{proxy.drain_timeout_s:g}",
        # HAProxy takes whole time units only: "0.5s" and "1e-05s" are refused, milliseconds are not.
        hard_stop_after=f"{max(1, round(stop_after_s * 1000))}ms",
        retry_after_s=proxy.retry_after_s,
        models_json=_plain(models_json, "model list"),
        user=proxy.user or "",
        group=proxy.run_group or "",
        body=body,
        mark=MARK,
        self_address=_self_address(bind),
    )


def _self_address(bind: str) -> str:
    """Where a worker reaches the proxy's own frontend: loopback for a wildcard bind."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "*": "127.0.0.1", "": "127.0.0.1"}.get(bind, bind)


@dataclass(frozen=True)
class _Backend:
    """What the template writes for one routed name: its engine, and the hold when on demand."""

    backend: str  # HAProxy's name for it: m1, m2 ... in the order of the names (served or on demand)
    name: str
    route: Route | None
    demand: DemandRoute | None
    alternates: tuple[tuple[str, int], ...] = ()  # other engines that may serve the name (address, port)

    @property
    def servers(self) -> list[_Server]:
        """A server per engine that may serve the name, in (address, port) order: ``engine``, then
        ``engine2`` ...; only the routed one enabled."""
        engines = {self.engine, *self.alternates}
        if self.demand is not None:
            engines.add((self.demand.address, self.demand.port))
        return [
            _Server("engine" if i == 0 else f"engine{i + 1}", a, p, self.serving and (a, p) == self.engine)
            for i, (a, p) in enumerate(sorted(engines))
        ]

    @property
    def demand_server(self) -> str:
        """The server a held request made ready goes to: the engine on demand's."""
        assert self.demand is not None
        return next(s.name for s in self.servers if (s.address, s.port) == (self.demand.address, self.demand.port))

    @property
    def engine(self) -> tuple[str, int]:
        """The serving engine, else the on-demand model's (listed disabled: reached only when held)."""
        if self.route is not None and self.route.address is not None and self.route.port is not None:
            return self.route.address, self.route.port
        assert self.demand is not None
        return self.demand.address, self.demand.port

    @property
    def serving(self) -> bool:
        return self.route is not None

    @property
    def hold_s(self) -> str:
        """The proxy's bound on a hold, in whole seconds (the Lua's argument)."""
        assert self.demand is not None
        return str(math.ceil(self.demand.deadline_s + DEMAND_MARGIN_S))


@dataclass(frozen=True)
class _Server:
    """One engine server of a backend, as the template writes it."""

    name: str
    address: str
    port: int
    enabled: bool


def render_unit(proxy: Proxy, bind: str, template: str) -> str:
    return compiled(template, trim=False).render(
        bind=bind,
        port=proxy.port,
        config_path=proxy.config_path,
        haproxy=proxy.haproxy,
        master_socket=master_socket(proxy),
    )


def master_socket(proxy: Proxy) -> str:
    return proxy.master_socket


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
