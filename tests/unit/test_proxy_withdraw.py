"""Taking engines out of the running proxy without a reload (adapters/haproxy.py `withdraw`, the route
move of an on-demand swap): a real HAProxy in master-worker mode on loopback from the rendered config,
in front of loopback engines; and the in-memory fake held to the same promises."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.observed import UnitState
from orchestrator.core.proxy import HostRouting, Route, sha
from orchestrator.testing import FakeProxy
from tests.builders.haproxy import Engine, free_port, haproxy, post, render_front
from tests.hosts.wait import wait_for


class ActiveUnit:
    """The proxy's unit as systemd would report it running (the test runs HAProxy itself)."""

    def unit_state(self, unit: str) -> UnitState:
        return UnitState(unit, "loaded", "active", "running")


@dataclass
class Front:
    port: int
    busy: Engine
    quiet: Engine
    adapter: HaproxyProxy
    config: Path


@pytest.fixture
def front(tmp_path: Path) -> Iterator[Front]:
    busy, quiet = Engine().start(), Engine().start()
    port = free_port()
    routes = [Route("busy", "127.0.0.1", busy.port), Route("quiet", "127.0.0.1", quiet.port)]
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(render_front(tmp_path, Proxy(enabled=True, port=port), routes))
    (tmp_path / "haproxy.cfg.applied").write_text(sha(cfg.read_text()) + "\n")  # it runs the config on disk
    with haproxy(cfg, port, master_sock=tmp_path / "master.sock"):
        proxy = Proxy.model_construct(
            **{
                **Proxy().model_dump(),
                "enabled": True,
                "port": port,
                "stats_socket": f"{tmp_path}/admin.sock",
                "config_path": str(cfg),
            }
        )
        adapter = HaproxyProxy(
            LocalShell(),
            ActiveUnit(),
            proxy,
            "127.0.0.1",
            "",  # type: ignore[arg-type]
            python=sys.executable,
        )
        yield Front(port, busy, quiet, adapter, cfg)
    busy.close()
    quiet.close()


def test_a_withdrawn_engine_gets_no_new_request_while_its_request_in_flight_finishes(front: Front) -> None:
    """busy holds a request as it is withdrawn: new requests for busy get 503 at once, quiet still
    serves, the one in flight is counted until it ends with 200; no reload happened."""
    front.busy.release.clear()
    engine = ("127.0.0.1", front.busy.port)
    results: list[int] = []
    client = threading.Thread(target=lambda: results.append(post(front.port, "busy")[0]))
    client.start()
    wait_for(
        lambda: front.adapter.sessions([engine]),
        lambda s: s.get(engine, Sessions(0, None)).current == 1,
        timeout=20,
        what="the held request counted by HAProxy",
    )
    assert front.adapter.withdraw([engine]) is True
    assert post(front.port, "busy")[0] == 503 and post(front.port, "quiet")[0] == 200
    assert front.adapter.sessions([engine])[engine].current == 1
    front.busy.release.set()
    client.join(30)
    assert results == [200] and len([a for a in front.busy.seen if a.path == "/v1/completions"]) == 1


def test_the_next_apply_after_a_withdraw_reloads_even_the_same_config(front: Front) -> None:
    """The applied hash is cleared first: an apply of the unchanged config reloads, and busy serves again."""
    engine = ("127.0.0.1", front.busy.port)
    assert front.adapter.withdraw([engine]) is True
    assert (front.config.parent / "haproxy.cfg.applied").read_text().strip() != sha(front.config.read_text())
    assert post(front.port, "busy")[0] == 503


def test_a_proxy_not_running_the_config_on_disk_refuses_to_withdraw(front: Front) -> None:
    """The applied hash is not the config's (a write the reload never followed): False, nothing changed."""
    (front.config.parent / "haproxy.cfg.applied").write_text("something else\n")
    assert front.adapter.withdraw([("127.0.0.1", front.busy.port)]) is False
    assert post(front.port, "busy")[0] == 200


def test_the_fake_proxy_keeps_the_same_promises() -> None:
    """FakeProxy: refuses with nothing applied; after a withdraw the same config applies again (a reload)."""
    fake = FakeProxy()
    routing = HostRouting(Proxy(enabled=True, port=9000), "127.0.0.1", (Route("m", "127.0.0.1", 1),))
    assert fake.withdraw([("127.0.0.1", 1)]) is False
    assert fake.apply(routing) is True and fake.apply(routing) is False
    assert fake.withdraw([("127.0.0.1", 1)]) is True and fake.withdrawn == [("127.0.0.1", 1)]
    assert fake.apply(routing) is True and fake.withdrawn == []


def test_an_engine_the_running_config_has_no_server_for_is_not_withdrawn(front: Front) -> None:
    """No server at that engine in the config it runs: False (the caller reloads), nothing changed."""
    assert front.adapter.withdraw([("127.0.0.1", 1)]) is False
    assert (front.config.parent / "haproxy.cfg.applied").read_text().strip() == sha(front.config.read_text())
