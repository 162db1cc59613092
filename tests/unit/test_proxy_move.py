"""Moving a route between a name's alternates without a reload (core/proxy_move.py, adapters/haproxy.py
``apply``): the decision on rendered configs, and a real HAProxy in master-worker mode on loopback in
front of two loopback engines, where the move must change no worker and leave the file saying what runs."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.adapters import haproxy_master
from orchestrator.adapters.haproxy import MOVING, HaproxyProxy
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import Procs, Sessions, parse_show_proc, stat_rows
from orchestrator.core.observed import UnitState
from orchestrator.core.proxy import DEMAND_LUA, DemandRoute, HostRouting, Route, render_routing, sha
from orchestrator.core.proxy_move import ServerState, move_commands, moved, runtime_move, server_states
from orchestrator.resources import template_text
from tests.builders.haproxy import Engine, free_port, haproxy, post, render_front
from tests.hosts.wait import wait_for

A, B = ("127.0.0.1", 8001), ("127.0.0.1", 8002)
CHAT = [Route("chat", *A), Route("chat", *B)]  # the catalog's alternates for "chat"


def config(routes: list[Route], tmp: Path = Path("/tmp/x"), alternates: list[Route] = CHAT) -> str:
    return render_front(tmp, Proxy(enabled=True, port=9000), routes, alternates=alternates)


# -- the decision, pure ----------------------------------------------------------------------------
def test_a_backend_lists_every_alternate_and_enables_only_the_routed_one() -> None:
    """ "chat" routed to B: servers engine (A, disabled) and engine2 (B); the states read back from the text."""
    text = config([Route("chat", *B)])
    assert 'server engine "127.0.0.1:8001" disabled' in text and 'server engine2 "127.0.0.1:8002"\n' in text
    assert server_states(text) == {("m1", "engine"): False, ("m1", "engine2"): True, ("m1", "current"): True}


def test_a_name_without_alternates_renders_its_one_server_as_before() -> None:
    """No alternate: the one `server engine ADDR` line, as every config rendered before."""
    text = config([Route("chat", *A)], alternates=[])
    assert 'server engine "127.0.0.1:8001"\n' in text and "engine2" not in text


def test_a_switch_between_alternates_is_a_runtime_move_ready_first() -> None:
    """A -> B: engine2 made ready, then engine put in maintenance (never no server for the name)."""
    move = runtime_move(config([Route("chat", *A)]), config([Route("chat", *B)]))
    assert move == (ServerState("m1", "engine2", True), ServerState("m1", "engine", False))
    assert move_commands(move) == [
        "@1 set server m1/engine2 state ready; @1 set server m1/engine state maint",
        "@1 show stat",
    ]


def test_the_same_routing_needs_no_move() -> None:
    """The same config: nothing to change."""
    assert runtime_move(config([Route("chat", *A)]), config([Route("chat", *A)])) == ()


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ([Route("chat", *A)], [Route("chat")]),  # a gap: 503 while it restarts
        ([Route("chat", *A)], [Route("chat", *A), Route("other", "127.0.0.1", 8003)]),  # a name added
        ([Route("chat", *A)], [Route("chat", "127.0.0.1", 8009)]),  # an engine no server lists
    ],
    ids=["gap", "name-added", "new-server"],
)
def test_any_other_change_needs_a_reload(before: list[Route], after: list[Route]) -> None:
    """A gap, another name, a server the running config lacks: None (the adapter reloads)."""
    assert runtime_move(config(before), config(after)) is None


def test_moved_reads_each_server_state_from_show_stat() -> None:
    """Made ready: not MAINT; put in maintenance: MAINT; a server missing from the stats: not moved."""
    stat = "# pxname,svname,status\nm1,engine,MAINT\nm1,engine2,no check\n"
    change = (ServerState("m1", "engine2", True), ServerState("m1", "engine", False))
    assert moved(stat, change)
    assert not moved(stat, (ServerState("m1", "engine", True),))
    assert not moved(stat, (ServerState("m2", "engine", False),))


ALPHA, BETA = ("127.0.0.1", 8011), ("127.0.0.1", 8012)
ON_DEMAND = [DemandRoute("alpha", *ALPHA, 30.0), DemandRoute("beta", *BETA, 30.0)]


def demand_config(routes: list[Route], demand: list[DemandRoute] = ON_DEMAND) -> str:
    """alpha and beta on their own engines; those in ``demand`` on demand (held while nothing routes them)."""
    alternates = [Route("alpha", *ALPHA), Route("beta", *BETA)]
    extra = {"demand": demand, "demand_socket": "/run/demand.sock", "lua": "-- hold"} if demand else {}
    return render_front(Path("/tmp/x"), Proxy(enabled=True, port=9000), routes, alternates=alternates, **extra)


def test_an_on_demand_swap_is_two_runtime_moves_through_a_config_routing_neither() -> None:
    """alpha -> (nothing: both held) -> beta, both on demand: each backend stays with its server
    disabled, so the withdraw puts alpha's engine in maintenance and the route to beta makes it ready."""
    alpha, neither, beta = (
        demand_config([Route("alpha", *ALPHA)]),
        demand_config([]),
        demand_config([Route("beta", *BETA)]),
    )
    assert runtime_move(alpha, neither) == (ServerState("m1", "engine", False),)
    assert runtime_move(neither, beta) == (ServerState("m2", "engine", True),)
    assert server_states(neither) == {("m1", "engine"): False, ("m2", "engine"): False} | {
        (b, "current"): True for b in ("m1", "m2")
    }


def test_a_displaced_name_not_on_demand_leaving_needs_a_reload() -> None:
    """alpha served but not on demand: routing neither drops its backend (it becomes "not loaded"):
    None, so the swap withdraws alpha's engine and its route to beta reloads, as before."""
    only_beta = [DemandRoute("beta", *BETA, 30.0)]
    assert runtime_move(demand_config([Route("alpha", *ALPHA)], only_beta), demand_config([], only_beta)) is None


# -- a real HAProxy ----------------------------------------------------------------------------------
class ActiveUnit:
    """The proxy's unit as systemd would report it running and installed (the test runs HAProxy itself)."""

    def unit_state(self, unit: str) -> UnitState:
        return UnitState(unit, "loaded", "active", "running")

    def read_unit(self, unit: str) -> str:
        return ""


@dataclass
class Front:
    port: int
    a: Engine
    b: Engine
    adapter: HaproxyProxy
    config: Path
    master: Path
    proxy: Proxy

    def routing(self, engine: Engine) -> HostRouting:
        alternates = (Route("chat", "127.0.0.1", self.a.port), Route("chat", "127.0.0.1", self.b.port))
        return HostRouting(self.proxy, "127.0.0.1", (Route("chat", "127.0.0.1", engine.port),), alternates=alternates)

    def procs(self) -> Procs:
        procs = parse_show_proc(haproxy_master.ask(str(self.master), "show proc") or "")
        assert procs is not None
        return procs

    def running(self) -> dict[tuple[str, str], bool]:
        """The current worker's servers and whether each serves (not in maintenance)."""
        stat = haproxy_master.ask(str(self.master), "@1 show stat") or ""
        rows = [r for r in stat_rows(stat) if r["svname"] not in ("FRONTEND", "BACKEND")]
        return {(r["pxname"], r["svname"]): not r["status"].startswith("MAINT") for r in rows}


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    a, b = Engine().start(), Engine().start()
    port = free_port()
    proxy = Proxy.model_construct(
        **{
            **Proxy().model_dump(),
            "enabled": True,
            "port": port,
            "stats_socket": f"{tmp_path}/admin.sock",
            "config_path": str(tmp_path / "haproxy.cfg"),
        }
    )
    adapter = HaproxyProxy(LocalShell(), ActiveUnit(), proxy, "127.0.0.1", "", python=sys.executable)  # type: ignore[arg-type]
    f = Front(port, a, b, adapter, tmp_path / "haproxy.cfg", tmp_path / "master.sock", proxy)
    f.config.write_text(render_routing(f.routing(a), template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA)))
    (tmp_path / "haproxy.cfg.applied").write_text(sha(f.config.read_text()) + "\n")  # it runs the config on disk
    with haproxy(f.config, port, master_sock=f.master):
        yield f
    a.close()
    b.close()


def _answered_by(front: Front) -> str:
    """Which engine answered one completion for "chat": "a" or "b"."""
    before = len(front.a.seen), len(front.b.seen)
    assert post(front.port, "chat")[0] == 200
    return "a" if len(front.a.seen) > before[0] else "b"


def test_the_route_moves_with_no_reload_and_the_file_says_what_runs(front: Front) -> None:
    """apply(chat -> b) with chat -> a running: True; the master's reload count and worker unchanged,
    the next request reaches b, the file is the new config, its hash applied, its servers' states the
    running worker's."""
    assert _answered_by(front) == "a"
    procs = front.procs()
    assert front.adapter.apply(front.routing(front.b)) is True
    assert front.procs().reloads == procs.reloads and front.procs().workers == procs.workers
    assert _answered_by(front) == "b" and _answered_by(front) == "b"
    text = front.config.read_text()
    assert f'"127.0.0.1:{front.b.port}"\n' in text
    assert (front.config.parent / "haproxy.cfg.applied").read_text().strip() == sha(text)
    assert front.running() == server_states(text)
    assert front.adapter.apply(front.routing(front.b)) is False  # applied: nothing left to do


def test_a_keep_alive_client_s_next_request_goes_to_the_new_engine(front: Front) -> None:
    """One client connection across the move: its second request is routed by the new state (b)."""
    conn = http.client.HTTPConnection("127.0.0.1", front.port, timeout=10)
    body = json.dumps({"model": "chat", "prompt": "hi"})
    headers = {"Content-Type": "application/json"}
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    assert conn.getresponse().read() and len(front.a.seen) == 1
    assert front.adapter.apply(front.routing(front.b)) is True
    conn.request("POST", "/v1/completions", body=body, headers=headers)
    assert conn.getresponse().status == 200 and len(front.b.seen) == 1 and len(front.a.seen) == 1
    conn.close()


def test_a_request_in_flight_at_the_left_engine_finishes_and_is_counted_until_then(front: Front) -> None:
    """a holds a request as the route moves to b: it is counted at a (the drain waits for it), new ones
    go to b, and it ends with 200."""
    front.a.release.clear()
    engine = ("127.0.0.1", front.a.port)
    results: list[int] = []
    client = threading.Thread(target=lambda: results.append(post(front.port, "chat")[0]))
    client.start()
    wait_for(
        lambda: front.adapter.sessions([engine]),
        lambda s: s.get(engine, Sessions(0, None)).current == 1,
        timeout=20,
        what="the held request counted by HAProxy",
    )
    assert front.adapter.apply(front.routing(front.b)) is True
    assert _answered_by(front) == "b" and front.adapter.sessions([engine])[engine].current == 1
    front.a.release.set()
    client.join(30)
    assert results == [200] and front.adapter.sessions([engine])[engine].current == 0


class DiesBeforeTheHash(LocalShell):
    """A shell whose agent is killed (an exception) as it would write the applied hash of a config:
    after the runtime change and the file, before the proof is recorded."""

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        if path.endswith(".applied") and data != MOVING:
            raise KeyboardInterrupt("killed")
        super().write_file(path, data, mode)


def test_killed_after_the_runtime_change_the_next_apply_reloads(front: Front) -> None:
    """Killed between the move and the applied hash: the file already routes like the running worker
    (a restart of HAProxy would serve b too) and the applied file names no config, so the next apply
    of any routing reloads rather than trust a state it did not prove."""
    dying = HaproxyProxy(DiesBeforeTheHash(), ActiveUnit(), front.proxy, "127.0.0.1", "", python=sys.executable)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        dying.apply(front.routing(front.b))
    text = front.config.read_text()
    assert front.running() == server_states(text) and _answered_by(front) == "b"
    applied = (front.config.parent / "haproxy.cfg.applied").read_bytes()
    assert applied == MOVING and applied.decode().strip() != sha(text)
    assert front.adapter._move(text, text.replace("disabled", "")) is False  # no runtime move on an unproven state


def test_a_proxy_not_running_the_config_on_disk_does_not_move_at_runtime(front: Front) -> None:
    """The applied hash is not the file's (a write the reload never followed): no runtime move (apply
    reloads instead), and nothing changed in the running worker."""
    (front.config.parent / "haproxy.cfg.applied").write_text("something else\n")
    running = front.running()
    assert front.adapter._move(front.config.read_text(), front.config.read_text().replace(" disabled", "")) is False
    assert front.running() == running and _answered_by(front) == "a"
