"""Models on demand, the idle policy, on a test host: the agent (a systemd unit) with the stand-in
engine in sleep mode (cold load 2 s, wake 0.3 s) behind the real HAProxy. An idle model sleeps after
`idle_sleep_s`, requests through the proxy keep it awake (HAProxy's own session counts), and a
sleeper is stopped after `idle_stop_s` with its GPUs verified free."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.builders.agent import STATE
from tests.builders.proxy import base_url, proxy_config
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import active, cli, history, install_agent
from tests.test_warm_hosts import ENGINE

pytestmark = pytest.mark.hosts
IDLE = {
    "port": 8131,
    "served_name": "chat",
    "sleep": "level1",
    "wake_deadline_s": 5,
    "args": ENGINE,
    "on_demand": True,
    "idle_sleep_s": 3,
    "idle_stop_s": 8,
}


def sleeping(host: Host) -> bool | None:
    """alpha's own word; None when it does not answer (stopped)."""
    try:
        r = httpx.get(f"http://{host.address}:{IDLE['port']}/is_sleeping", timeout=5)
    except httpx.HTTPError:
        return None
    return bool(r.json()["is_sleeping"])


def residency_states(entry: dict[str, Any]) -> dict[str, str]:
    return {m["model"]: m["state"] for m in entry["residency"]["models"]}


def status(host: Host) -> dict[str, Any]:
    return dict(json.loads(cli(host, "status", "--json").stdout)["hosts"][host.name])


@pytest.fixture
def idle_agent(hosts: list[Host], tmp_path: Path) -> Iterator[Host]:
    """h1's agent with alpha on demand (idle_sleep_s 3, idle_stop_s 8); alpha switched to by an operator."""
    host = hosts[0]
    config = proxy_config(host, Path(STATE), {"alpha": IDLE}).replace('transport = "ssh"', 'transport = "local"', 1)
    config = config.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\nsleep_ram_gib = 8\n", 1)
    install_agent(host, config, tmp_path)
    assert json.loads(cli(host, "switch", "alpha", "--json").stdout)["outcome"] == "active"
    yield host
    host.run(
        "systemctl stop orchestrator-agent.service orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*",
        check=False,
    )


def test_requests_keep_a_model_awake_then_it_sleeps_after_idle_sleep_s_and_stops_after_idle_stop_s(
    idle_agent: Host,
) -> None:
    """The idle policy end to end (one agent, one cold start: the suite's time): completions through
    the proxy for twice idle_sleep_s keep alpha awake (HAProxy counts them); once they stop, alpha
    sleeps and leaves the route, with no deployment recorded; after idle_stop_s it is stopped and
    nvidia-smi shows nothing of it left."""
    host = idle_agent
    stop = threading.Event()
    answers: list[int] = []

    def client() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.wait(0.5):
                answers.append(
                    c.post(
                        f"{base_url(host)}/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2}
                    ).status_code
                )

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(answers), lambda n: n >= 12, timeout=30, what="6 s of completions through the proxy")
        assert sleeping(host) is False, "alpha slept while it served requests"
    finally:
        stop.set()
        thread.join(15)
    assert set(answers) == {200}
    # The agent records the sleep once the engine's /sleep has answered: await the record (what status
    # reports), then check the engine agrees; the engine's own word comes first and proves nothing of it.
    entry = wait_for(
        lambda: status(host),
        lambda e: residency_states(e) == {"alpha": "asleep"},
        timeout=30,
        what="alpha recorded asleep after idle_sleep_s",
    )
    assert entry["models"] == [] and sleeping(host) is True
    assert [h["trigger"] for h in history(host)].count("demand:alpha") == 0  # an idle sleep is no deployment
    wait_for(
        lambda: active(host, "vllm-alpha.service"),
        lambda s: s != "active",
        timeout=30,
        what="alpha stopped after idle_stop_s",
    )
    entry = wait_for(
        lambda: status(host),
        lambda e: residency_states(e) == {"alpha": "stopped"},
        timeout=30,
        what="alpha recorded stopped after idle_stop_s",
    )
    res = entry["residency"]
    assert all(not g["processes"] for g in res["gpus"]), res["gpus"]
