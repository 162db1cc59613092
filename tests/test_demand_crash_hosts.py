"""Crash recovery of an on-demand swap: the agent SIGKILLed inside a warm swap that a held request started,
after the running proxy stopped routing to the displaced engine (a runtime move, no reload) and before
the route to the target; systemd restarts the agent. The swap ends, the proxy runs what its file says,
and the request held through the kill is answered by the restarted agent, never cut or left hanging."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.builders.agent import HOOKS, STATE, cli, engine_sleeping, history, install_agent, sigkill_agent
from tests.builders.demand import AB, Client, demand_config, url
from tests.builders.proxy_state import proxy_state
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for

pytestmark = pytest.mark.hosts


@pytest.fixture
def demand_box(hosts: list[Host], tmp_path: Path) -> Iterator[Host]:
    """h1's agent with alpha and beta on demand on the same GPUs: alpha serves, beta sleeps."""
    host = hosts[0]
    install_agent(host, demand_config(host, Path(STATE), AB, max_swaps_per_min=60, batch_wait_s=1.0), tmp_path)
    cli(host, "switch", "beta")
    cli(host, "switch", "alpha")
    yield host
    host.run(
        "systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'; "
        "rm -f /etc/orchestrator/haproxy.cfg* /etc/orchestrator/demand_hold.lua",
        check=False,
    )


def is_sleeping(host: Host, model: str) -> bool | None:
    return engine_sleeping(host, int(AB[model]["port"]))


@pytest.mark.parametrize("where", ["pause-on routed", "pause-at routing"])
def test_sigkill_inside_an_on_demand_swap_converges_and_answers_the_held_request(demand_box: Host, where: str) -> None:
    """A request for the sleeping beta starts a warm swap; the agent is SIGKILLed right after the
    running proxy stopped routing to alpha ("routed" in `sleeping`) or as `routing` begins (beta woken,
    not routed yet). The swap ends active or rolled back, one model serves awake and the proxy routes
    to it as its file says, and the held request is answered 200: the proxy's hold asks the restarted agent."""
    host = demand_box
    hook, what = where.split(" ", 1)
    host.write_file(f"{HOOKS}/{hook}", what)
    client = Client(url(host), ["beta"], rounds=1, timeout=120).__enter__()
    wait_for(
        lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0,
        what=f"the swap to pause ({where})",
        timeout=60,
    )
    sigkill_agent(host, f"{hook} paused")
    client.thread.join(150)
    assert not client.thread.is_alive(), "the held request is still waiting 150 s after the kill"
    newest = wait_for(
        lambda: history(host)[0],
        lambda d: d["outcome"] in ("active", "rolled_back", "failed", "aborted"),
        what="the interrupted swap to end",
        timeout=90,
    )
    assert newest["model"] == "beta" and newest["outcome"] in ("active", "rolled_back"), newest.get("error")
    serving, other = ("beta", "alpha") if newest["outcome"] == "active" else ("alpha", "beta")
    (answer,) = client.answers
    print(f"killed at {where}: {newest['outcome']}; the held request: {answer.status} after {answer.wait:.2f} s")
    assert answer.status == 200, answer  # the hold asked the restarted agent again
    assert is_sleeping(host, serving) is False and is_sleeping(host, other) in (True, None)
    state = proxy_state(host)
    assert state.file_matches_running
    backend = {"alpha": "m1", "beta": "m2"}  # both names on demand: a backend each, in the names' order
    assert [a.rsplit(":", 1)[1] for a in state.serving(backend[serving])] == [str(AB[serving]["port"])]
    assert state.serving(backend[other]) == []
    again = httpx.post(f"{url(host)}/completions", json={"model": serving, "prompt": "hi", "max_tokens": 2}, timeout=60)
    assert again.status_code == 200
