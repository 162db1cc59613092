"""Models on demand follow `config push` without an agent restart: a push that adds the first on-demand
model opens the demand socket and starts the broker's loops, one that removes the last closes and
stops them (a request still held gets a 503), one that moves `[proxy] demand_socket` reopens it; the
front proxy is re-rendered at once when what it holds for changes. The agent's real config-reload path
(dispatch of config_push) over a fake host and proxy."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.agent.daemon import Agent
from orchestrator.core.catalog import Catalog
from orchestrator.deploy.locks import host_lock
from orchestrator.deploy.operations import Operations
from orchestrator.testing import FakeClock, FakeHost, FakeProxy, FakeStateStore, FakeWeights
from tests.hosts.wait import wait_for


def deploy_toml(state: Path, sock: Path, *, on_demand: bool, extra: str = "") -> str:
    return (
        f'state_dir = "{state}"\n'
        f'[proxy]\nenabled = true\nport = 9000\ndemand_socket = "{sock}"\n'
        '[hosts.box]\ntransport = "ssh"\naddress = "127.0.0.9"\ngpus = 8\ngpu_memory_gib = 96\n'
        '[models.a]\nrepo = "org/a"\ngpus = [0]\nport = 8001\n'
        + ("on_demand = true\n" if on_demand else "")
        + extra
        + '[models.b]\nrepo = "org/b"\ngpus = [1]\nport = 8002\n'
    )


class Pushed:
    """An agent started from deploy.toml in ``tmp`` (its ports a fake host); push replaces the file."""

    def __init__(self, tmp: Path, *, on_demand: bool) -> None:
        self.tmp = tmp
        self.sock = tmp / "demand.sock"
        self.path = tmp / "deploy.toml"
        self.path.write_text(deploy_toml(tmp / "state", self.sock, on_demand=on_demand))
        clock = FakeClock()
        host = FakeHost(name="box", clock=clock)
        catalog = settings.load(self.path)
        self.proxy = FakeProxy()
        ports = dataclasses.replace(host.ports(catalog.hosts["box"], FakeWeights()), proxy=self.proxy)
        store = FakeStateStore()

        def ops_for(cat: Catalog) -> Operations:  # as wiring builds them: no proxy port while [proxy] is off
            mine = ports if cat.proxy.enabled else dataclasses.replace(ports, proxy=None)
            return Operations(cat, lambda name: mine, store=store)

        self.agent = Agent(
            catalog,
            ops_for(catalog),
            socket=str(tmp / "agent.sock"),
            metrics_port=None,
            clock=clock,
            config_path=str(self.path),
            ops_factory=ops_for,
        )

    def push(self, text: str, uid: int | None = None) -> list[dict[str, Any]]:
        return list(self.agent.dispatch("config_push", {"text": text, "name": "new.toml"}, "alice@test", uid=uid))

    def text(self, *, on_demand: bool, sock: Path | None = None, extra: str = "") -> str:
        return deploy_toml(self.tmp / "state", sock or self.sock, on_demand=on_demand, extra=extra)

    def loops(self) -> set[str]:
        return {loop.name for loop in self.agent.demand.loops if loop.thread.is_alive()}


def ask(path: Path, model: str) -> tuple[socket.socket, dict[str, Any]]:
    """A held request's connection and its first line."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    sock.sendall(json.dumps({"model": model}).encode() + b"\n")
    return sock, json.loads(sock.makefile("rb").readline())


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Pushed]:
    """An agent whose file has no model on demand, synced as at its start."""
    world = Pushed(tmp_path, on_demand=False)
    world.agent.demand.sync()
    yield world
    world.agent.stop()
    world.agent.demand.stop()


def test_a_push_that_adds_the_first_on_demand_model_opens_the_socket_and_starts_the_loops(started: Pushed) -> None:
    """No socket and no loops before; after the push both, and the socket answers a held request."""
    assert not started.sock.exists() and started.loops() == set()
    started.push(started.text(on_demand=True))
    assert started.loops() == {"demand", "demand_idle"}
    sock, first = ask(started.sock, "nope")
    sock.close()
    assert first["status"] == 404
    assert started.agent.info()["demand"]["hosts"]["box"]["swaps_last_min"] == 0


def test_a_push_that_removes_the_last_on_demand_model_closes_the_socket_and_answers_the_held(started: Pushed) -> None:
    """On demand, then a push without it: the loops end, the socket file goes, a request held meanwhile
    gets one 503 naming why instead of waiting for a pass that never comes."""
    started.push(started.text(on_demand=True))
    started.agent.demand.halt()  # no pass decides for the request: it stays held until the push
    wait_for(lambda: started.loops(), lambda s: s == set(), timeout=10, what="the demand loops halted")
    ticket = started.agent.broker.open("a")
    assert ticket.answer is None
    started.push(started.text(on_demand=False))
    assert started.loops() == set() and not started.sock.exists()
    assert ticket.answer is not None and ticket.answer["status"] == 503
    assert "no model is on demand any more" in ticket.answer["message"]


def test_a_push_that_moves_the_demand_socket_reopens_it_there(started: Pushed) -> None:
    """[proxy] demand_socket changed by a push: the old path goes, the new one answers; the loops go on."""
    started.push(started.text(on_demand=True))
    loops = list(started.agent.demand.loops)
    moved = started.tmp / "moved.sock"
    started.push(started.text(on_demand=True, sock=moved), uid=0)  # a root-only key
    assert not started.sock.exists()
    sock, first = ask(moved, "nope")
    sock.close()
    assert first["status"] == 404 and started.agent.demand.loops == loops


def test_a_stopping_agent_starts_no_loops_on_a_push(started: Pushed) -> None:
    """A push that adds an on-demand model while the agent stops starts no loop that would outlive it."""
    started.agent.stop()
    started.push(started.text(on_demand=True))
    assert started.agent.demand.loops == []


def held(config: str | None) -> list[str]:
    """The served names the proxy config holds for (its demand_hold lines)."""
    return [
        line.split('-m str "')[1].split('"')[0] for line in (config or "").splitlines() if "lua.demand_hold" in line
    ]


def test_a_push_that_makes_a_model_on_demand_reloads_the_proxy_to_hold_for_it(started: Pushed) -> None:
    """b serves, a is stopped (its name a 404): the push making a on demand reloads the proxy at once,
    b still routed, a held; no switch, stop or idle sleep needed first."""
    switched = list(started.agent.dispatch("switch", {"model": "b"}, "alice@test"))
    assert switched[-1]["result"]["outcome"] == "active"
    before = len(started.proxy.applied)
    assert held(started.proxy.config) == []
    result = started.push(started.text(on_demand=True))[-1]["result"]
    assert result["proxy"] == {"box": "reloaded"} and len(started.proxy.applied) == before + 1
    engines = [
        line.split()[2:]
        for line in (started.proxy.config or "").splitlines()
        if line.strip().startswith("server engine")
    ]
    assert held(started.proxy.config) == ["a"] and engines == [['"127.0.0.9:8001"', "disabled"], ['"127.0.0.9:8002"']]


def test_a_push_that_changes_a_held_bound_reloads_and_one_that_changes_no_hold_does_not(started: Pushed) -> None:
    """The proxy reloads for a changed demand_deadline_s (rendered into the hold), not for a push
    that leaves every hold as it was; one that takes on demand away drops the hold."""
    started.push(started.text(on_demand=True))
    applied = len(started.proxy.applied)
    assert "proxy" not in started.push(started.text(on_demand=True, extra="min_awake_s = 30\n"))[-1]["result"]
    assert len(started.proxy.applied) == applied
    longer = started.push(started.text(on_demand=True, extra="demand_deadline_s = 77\n"))[-1]["result"]
    assert longer["proxy"] == {"box": "reloaded"} and " 79 " in (started.proxy.config or "")
    started.push(started.text(on_demand=False))
    assert held(started.proxy.config) == [] and len(started.proxy.applied) == applied + 2


def test_a_push_whose_proxy_cannot_be_reloaded_says_so_and_keeps_the_push(started: Pushed) -> None:
    """The proxy's port taken (it never started): the push is in place, its result names the host and why."""
    started.proxy.taken_by = "port 9000 is held by nginx (pid 7)"
    result = started.push(started.text(on_demand=True))[-1]["result"]
    assert result["changed"] and result["proxy"]["box"].startswith("not reloaded: port 9000 is held by nginx")
    assert started.loops() == {"demand", "demand_idle"} and started.proxy.config is None


def test_a_push_while_another_process_holds_the_hosts_lock_leaves_the_proxy_to_that_operation(started: Pushed) -> None:
    """A CLI without the agent holds box's lock: the push is in place, the proxy is not touched mid-operation."""
    with host_lock(str(started.tmp / "state"), "box"):
        result = started.push(started.text(on_demand=True))[-1]["result"]
    assert result["changed"] and result["proxy"]["box"].startswith("not reloaded: host box is busy")
    assert started.proxy.applied == []
