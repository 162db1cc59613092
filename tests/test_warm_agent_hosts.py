"""Crash recovery of a warm switch: the agent (a systemd unit in a test host) SIGKILLed as each warm
phase begins; systemd restarts it and the switch converges, observed with /is_sleeping and the units."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.builders.agent import STATE
from tests.hosts.machine import Host
from tests.test_agent_hosts import active, cli, history, install_agent, kill_agent_paused_before
from tests.test_warm_hosts import MODELS, warm_config

pytestmark = pytest.mark.hosts
WARM_MODELS = {m: MODELS[m] for m in ("alpha", "beta")}


def is_sleeping(host: Host, model: str) -> bool | None:
    """The engine's own word; None when it does not answer (stopped)."""
    try:
        r = httpx.get(f"http://{host.address}:{WARM_MODELS[model]['port']}/is_sleeping", timeout=5)
    except httpx.HTTPError:
        return None
    return bool(r.json()["is_sleeping"])


@pytest.fixture
def warm_agent(hosts: list[Host], tmp_path: Path) -> Iterator[Host]:
    """h1's agent with alpha and beta sleep-enabled behind the proxy; alpha asleep, beta serving."""
    host = hosts[0]
    config = warm_config(host, Path(STATE)).replace('transport = "ssh"', 'transport = "local"', 1)
    install_agent(host, _only(config, WARM_MODELS), tmp_path)
    cli(host, "switch", "alpha")
    cli(host, "switch", "beta")
    assert is_sleeping(host, "alpha") is True
    yield host
    host.run(
        "systemctl stop orchestrator-agent.service orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*",
        check=False,
    )


def _only(config: str, models: dict[str, object]) -> str:
    """The config without the models this test does not deploy (gamma keeps its memory asleep)."""
    out, skip = [], False
    for line in config.splitlines(keepends=True):
        if line.startswith("["):
            skip = line.startswith("[models.") and line.strip()[len("[models.") : -1] not in models
        if not skip:
            out.append(line)
    return "".join(out)


@pytest.mark.parametrize("phase", ["sleeping", "verifying", "waking"])
def test_sigkill_as_a_warm_phase_begins_converges(warm_agent: Host, phase: str) -> None:
    """beta -> alpha (warm) with the agent SIGKILLed before PHASE: the switch ends, and the model it
    ends with serves awake while the other sleeps or is stopped; never both awake, never none."""
    host = warm_agent
    kill_agent_paused_before(host, phase, "alpha")
    newest = history(host)[0]
    assert newest["model"] == "alpha" and newest["outcome"] in ("active", "rolled_back"), newest.get("error")
    serving, other = ("alpha", "beta") if newest["outcome"] == "active" else ("beta", "alpha")
    assert active(host, f"vllm-{serving}.service") == "active" and is_sleeping(host, serving) is False
    assert is_sleeping(host, other) in (True, None)  # asleep, or stopped: never a second awake engine
    print(f"warm crash case {phase}: outcome {newest['outcome']}, serving {serving}")
