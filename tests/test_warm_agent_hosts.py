"""Crash recovery of a warm switch: the agent (a systemd unit in a test host) SIGKILLed as each warm
phase begins; systemd restarts it and the switch converges, observed with /is_sleeping and the units."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.adapters.haproxy import MOVING
from tests.builders.agent import CONFIG, HOOKS, PY, STATE, engine_sleeping, sigkill_agent
from tests.builders.proxy import base_url
from tests.builders.proxy_state import CONFIG as PROXY_CONFIG
from tests.builders.proxy_state import proxy_state
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import active, cli, history, install_agent, kill_agent_paused_before
from tests.test_warm_hosts import MODELS, warm_config

pytestmark = pytest.mark.hosts
WARM_MODELS = {m: MODELS[m] for m in ("alpha", "beta")}


def is_sleeping(host: Host, model: str) -> bool | None:
    return engine_sleeping(host, int(WARM_MODELS[model]["port"]))


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


@pytest.mark.parametrize("applied", ["written", "not-written"])
def test_sigkill_right_after_the_runtime_route_move_converges(warm_agent: Host, applied: str) -> None:
    """beta -> alpha with the agent SIGKILLed right after the route moved in the running proxy (no
    reload); "not-written": killed between that change and the applied hash, as the adapter leaves it
    then. The switch ends; the running proxy sends "chat" to the model it ends with, the file on disk
    says the same with its hash applied, and an unproven runtime state was reloaded, not trusted."""
    host = warm_agent
    before = proxy_state(host)
    host.write_file(f"{HOOKS}/pause-on", "routed")
    switch = shlex.join([PY, "-m", "orchestrator", "switch", "alpha", "--config", CONFIG])
    host.run(f"nohup {switch} > /tmp/switch.log 2>&1 &")
    wait_for(
        lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0,
        what="the engine to pause after the route moved",
        timeout=60,
    )
    moved = proxy_state(host)
    assert moved.reloads == before.reloads and [a.rsplit(":", 1)[1] for a in moved.serving()] == ["8121"]
    if applied == "not-written":
        host.write_file(PROXY_CONFIG + ".applied", MOVING.decode())
    sigkill_agent(host, "pause-on paused")
    wait_for(
        lambda: history(host)[0]["outcome"] in ("active", "rolled_back", "failed", "aborted"),
        what="the interrupted deployment to end",
        timeout=90,
    )
    newest = history(host)[0]
    assert newest["model"] == "alpha" and newest["outcome"] in ("active", "rolled_back"), newest.get("error")
    serving = "alpha" if newest["outcome"] == "active" else "beta"
    after = proxy_state(host)
    print(
        f"killed after the runtime move ({applied}): {newest['outcome']}, reloads {before.reloads} -> {after.reloads}"
    )
    assert after.file_matches_running
    assert [a.rsplit(":", 1)[1] for a in after.serving()] == [str(WARM_MODELS[serving]["port"])]
    assert is_sleeping(host, serving) is False
    if applied == "not-written":
        assert after.reloads is not None and before.reloads is not None and after.reloads > before.reloads
    answer = httpx.post(
        f"{base_url(host)}/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2}, timeout=10
    )
    assert answer.status_code == 200
