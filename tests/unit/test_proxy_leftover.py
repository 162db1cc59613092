"""An agent that starts from a file with [proxy] enabled = false stops and disables the host's
orchestrator-proxy.service still up from before (the file was edited and the agent restarted, no push
stopped it), records it, and leaves alone a host with no such unit, or with the proxy on. The agent's
real start step over a fake host."""

from __future__ import annotations

from pathlib import Path

from orchestrator import settings
from orchestrator.agent.daemon import Agent
from orchestrator.core.proxy import PROXY_UNIT
from orchestrator.deploy.operations import Operations
from orchestrator.testing import FakeClock, FakeHost, FakeStateStore, FakeWeights
from tests.unit.test_demand_push import deploy_toml

UNIT_TEXT = "[Service]\nExecStart=/usr/sbin/haproxy -Ws -f /etc/orchestrator/haproxy.cfg\n"


def _agent(tmp: Path, host: FakeHost, *, enabled: bool) -> tuple[Agent, FakeStateStore]:
    text = deploy_toml(tmp / "state", tmp / "demand.sock", on_demand=False)
    path = tmp / "deploy.toml"
    path.write_text(text if enabled else text.replace("enabled = true\n", "enabled = false\n", 1))
    catalog = settings.load(path)
    store = FakeStateStore()
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    ops = Operations(catalog, lambda name: ports, store=store)
    return Agent(
        catalog, ops, socket=str(tmp / "agent.sock"), metrics_port=None, clock=host.clock, config_path=str(path)
    ), store


def _proxy_up(host: FakeHost, *, running: bool = True) -> None:
    sd = host.ports().systemd
    sd.install_unit(PROXY_UNIT, UNIT_TEXT)
    sd.daemon_reload()
    sd.enable(PROXY_UNIT)
    if running:
        sd.start(PROXY_UNIT)


def test_a_proxy_left_running_is_stopped_and_disabled_at_start(tmp_path: Path) -> None:
    """enabled = false, the unit active and enabled: stopped, disabled, and an event says it was running."""
    host = FakeHost(name="box", clock=FakeClock())
    _proxy_up(host)
    agent, store = _agent(tmp_path, host, enabled=False)
    done = agent.demand.settle_disabled_proxies()
    assert done == {"box": f"{PROXY_UNIT} stopped and disabled: agent start: [proxy] enabled = false"}
    assert host.ports().systemd.unit_state(PROXY_UNIT).active_state == "inactive"
    assert host.units[PROXY_UNIT].enabled is False
    assert [(e["reason"], e["was_running"]) for e in store.events(kind="proxy_stopped")] == [
        ("agent start: [proxy] enabled = false", True)
    ]


def test_a_stopped_but_enabled_proxy_is_disabled_so_a_reboot_does_not_start_it(tmp_path: Path) -> None:
    """enabled = false, the unit inactive but still enabled: disabled, recorded as not running."""
    host = FakeHost(name="box", clock=FakeClock())
    _proxy_up(host, running=False)
    agent, store = _agent(tmp_path, host, enabled=False)
    assert agent.demand.settle_disabled_proxies() == {
        "box": f"{PROXY_UNIT} disabled: agent start: [proxy] enabled = false"
    }
    assert host.units[PROXY_UNIT].enabled is False
    assert [e["was_running"] for e in store.events(kind="proxy_stopped")] == [False]


def test_no_proxy_unit_or_one_already_off_is_left_alone(tmp_path: Path) -> None:
    """enabled = false with no proxy unit, then with one stopped and disabled: nothing done, no event."""
    host = FakeHost(name="box", clock=FakeClock())
    agent, store = _agent(tmp_path, host, enabled=False)
    assert agent.demand.settle_disabled_proxies() == {}
    _proxy_up(host, running=False)
    host.ports().systemd.disable(PROXY_UNIT)
    assert agent.demand.settle_disabled_proxies() == {}
    assert store.events(kind="proxy_stopped") == []


def test_a_proxy_that_is_on_in_the_file_is_not_touched(tmp_path: Path) -> None:
    """enabled = true: the running proxy unit stays active and enabled (the first switch routes it)."""
    host = FakeHost(name="box", clock=FakeClock())
    _proxy_up(host)
    agent, store = _agent(tmp_path, host, enabled=True)
    assert agent.demand.settle_disabled_proxies() == {}
    assert host.ports().systemd.unit_state(PROXY_UNIT).active_state == "active"
    assert host.units[PROXY_UNIT].enabled is True and store.events(kind="proxy_stopped") == []
