"""Models on demand, the acceptance: a test host with the agent (its broker on the demand socket), the
real HAProxy holding requests in its Lua, the stand-in engine with sleep mode (cold load 2 s, wake
0.3 s), and clients sending completions through the proxy."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.agent import CONFIG, STATE, active, cli, history, install_agent
from tests.builders.demand import AB, FLOOD, HIGH, ON_DEMAND, Answer, Client, demand_config, url
from tests.builders.proxy import PROXY_PORT
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet
from tests.hosts.wait import wait_for

pytestmark = pytest.mark.hosts
AB_BATCH_S = 1.0
AB_CAP = 30
FLOOD_CAP = 4
FLOOD_S = 45.0  # every client asks until then
SLACK_S = 1.5  # the broker's tick, HAProxy and HTTP on a loaded 2-core machine


def _teardown(host: Host, reset: bool = False) -> None:
    host.run(
        "systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'; "
        "rm -f /etc/orchestrator/haproxy.cfg* /etc/orchestrator/demand_hold.lua",
        check=False,
    )
    if reset:
        host.reset()


@pytest.fixture(scope="module")
def box(host_set: HostSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """h1's agent with alpha and beta on demand, on the same GPUs (shared by this module's tests, reset after);
    HAProxy's workers drop to the haproxy account ([proxy] user)."""
    host = host_set.hosts[0]
    _teardown(host)
    install_agent(
        host,
        demand_config(host, Path(STATE), AB, max_swaps_per_min=AB_CAP, batch_wait_s=AB_BATCH_S, proxy_user="haproxy"),
        tmp_path_factory.mktemp("demand"),
    )
    # The proxy comes up with the agent's first apply: a switch of any model writes it; on demand
    # the first request does, so bring alpha up once by hand to have a proxy to send through.
    cli(host, "switch", "beta")
    cli(host, "switch", "alpha")  # beta sleeps: each is one wake away
    yield host
    _teardown(host, reset=True)


def demand_deployments(host: Host) -> list[dict[str, Any]]:
    return [d for d in history(host) if str(d.get("trigger", "")).startswith("demand:")]


def serving(host: Host) -> set[str]:
    res = json.loads(cli(host, "status", "--json").stdout)["hosts"][host.name]["residency"]
    return {m["model"] for m in res["models"] if m["state"] == "serving"}


def swaps_of(deployments: list[dict[str, Any]]) -> list[float]:
    """When each on-demand deployment that displaced a serving model began (what the cap counts)."""
    return [d["created_at"] for d in deployments if "; stops " in ((d.get("plan") or {}).get("reason") or "")]


def max_per_minute(times: list[float]) -> int:
    """The most of ``times`` in any 60 s window."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + 60) for i, t in enumerate(times)), default=0)


def _failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.failed]


def test_two_clients_alternating_a_and_b_never_fail(box: Host) -> None:
    """Two clients alternate alpha and beta (same GPUs): every request answers 200; each waits the batching
    bound and its own warm swap at most (plus the rest of the other model's swap when it came during
    one); the swaps stay under the cap."""
    before = {d["id"] for d in demand_deployments(box)}
    clients = [Client(url(box), ["alpha", "beta"], rounds=8), Client(url(box), ["beta", "alpha"], rounds=8)]
    for c in clients:
        c.__enter__()
    for c in clients:
        c.join(300)
    answers = [a for c in clients for a in c.answers]
    # The last request is answered once its model is routed; that swap's record ends a moment later.
    swaps = wait_for(
        lambda: [d for d in demand_deployments(box) if d["id"] not in before],
        lambda ds: all(d["ended_at"] is not None for d in ds),
        timeout=60,
        what="the on-demand swaps to end",
    )
    waits = sorted(a.wait for a in answers)
    print(
        f"alternating A/B: {len(answers)} requests, {len(swaps)} swaps, wait p50 {waits[len(waits) // 2]:.2f} s "
        f"max {waits[-1]:.2f} s; statuses {sorted({str(a.status) for a in answers})}"
    )
    for c in clients:
        print("  " + " ".join(f"{a.model}:{a.wait:.2f}" for a in c.answers))
    assert len(answers) == 16 and all(a.status == 200 for a in answers), [a for a in answers if a.status != 200]
    assert swaps and all(d["outcome"] == "active" for d in swaps)
    two = 0
    for a in answers:
        # A request waits for its own swap after the batching bound; one that came while the swap to the
        # other model ran waits for that one's end first. Never more, and never longer than those.
        during = [d for d in swaps if d["created_at"] < a.w1 and d["ended_at"] > a.w0]
        assert len(during) <= 2, (a, during)
        two += len(during) == 2
        took = sum(min(d["ended_at"], a.w1) - max(d["created_at"], a.w0) for d in during)
        assert a.wait <= AB_BATCH_S + took + SLACK_S, (a, took)
    print(f"  {two} of {len(answers)} requests came during the swap to the other model")
    assert max_per_minute(swaps_of(swaps)) <= AB_CAP


def test_the_proxy_workers_run_as_haproxy_and_the_socket_is_open_to_its_group(box: Host) -> None:
    """[proxy] user = "haproxy": HAProxy's workers run as haproxy (the requests above reached the agent
    through them); the agent made /run/orchestrator 0750 and the socket 0660, both root:haproxy."""
    master = box.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-proxy"]).stdout.strip()
    users = box.run(["ps", "-o", "user=", "--ppid", master]).stdout.split()
    assert users and set(users) == {"haproxy"}, users
    modes = box.run(["stat", "-c", "%a %U:%G", "/run/orchestrator", "/run/orchestrator/demand.sock"]).stdout.split("\n")
    assert modes[:2] == ["750 root:haproxy", "660 root:haproxy"], modes


def test_a_cancelled_cold_start_is_abandoned_and_its_memory_freed(box: Host) -> None:
    """A request for gamma (stopped, on free GPUs) whose client goes away once its cold start began: the
    start is abandoned, the engine stopped, and GPU 4-7 hold nothing."""
    body = json.dumps({"model": "gamma", "prompt": "hi", "max_tokens": 2}).encode()
    client = socket.create_connection((box.address, PROXY_PORT), timeout=10)
    client.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: box\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        wait_for(
            lambda: [d for d in demand_deployments(box) if d["model"] == "gamma"],
            timeout=60,
            what="gamma's on-demand cold start to begin",
        )
    finally:
        client.close()  # the only request waiting for gamma goes away
    newest = wait_for(
        lambda: [d for d in demand_deployments(box) if d["model"] == "gamma"][:1],
        lambda d: d and d[0]["ended_at"] is not None,
        timeout=60,
        what="gamma's on-demand cold start to end",
    )[0]
    assert newest["outcome"] == "rolled_back" and "abandoned" in (newest.get("error") or ""), newest
    assert active(box, "vllm-gamma.service") != "active"
    used = box.run("nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits").stdout
    mib = {int(i): int(m) for i, m in (ln.split(",") for ln in used.strip().splitlines())}
    assert [mib[g] for g in AB["gamma"]["gpus"]] == [0, 0, 0, 0], mib


def test_an_operators_switch_wins_and_on_demand_resumes(box: Host) -> None:
    """While a client asks for alpha, `switch beta` by the operator ends active (beta serving); alpha's
    requests bring alpha back after it; nothing fails but 429 with Retry-After."""
    cli(box, "switch", "alpha")
    with Client(url(box), ["alpha"]) as client:
        wait_for(lambda: len(client.answers), lambda n: n >= 3, what="the client's first answers")
        op = json.loads(cli(box, "switch", "beta", "--json").stdout)
        assert op["outcome"] == "active", op
        back = wait_for(
            lambda: [d for d in demand_deployments(box) if d["id"] > op["id"]],
            lambda ds: any(d["outcome"] == "active" and d["model"] == "alpha" for d in ds),
            timeout=60,
            what="on demand to bring alpha back after the operator's switch",
        )
        n = len(client.answers)
        wait_for(lambda: len(client.answers), lambda m: m >= n + 3, what="alpha answering again")
    assert _failures(client.answers) == []
    assert [d["model"] for d in back][-1] == "alpha" and serving(box) == {"alpha"}


def test_a_push_that_adds_a_model_on_demand_holds_its_first_request_and_starts_it(box: Host) -> None:
    """delta (GPU 4-7, stopped) is pushed on demand: the push reloads the proxy, and the very next request
    for delta is held and answered 200 by its cold start (it was a 404 until a switch rewrote the proxy)."""
    current = box.run(["cat", CONFIG]).stdout
    wanted = demand_config(
        box,
        Path(STATE),
        {**AB, "delta": {"port": 8144, "gpus": HIGH, **ON_DEMAND}},
        max_swaps_per_min=AB_CAP,
        batch_wait_s=AB_BATCH_S,
        proxy_user="haproxy",
    )
    delta = "[models.delta]" + wanted.split("[models.delta]", 1)[1].split("\n[", 1)[0] + "\n"
    box.write_file("/tmp/pushed.toml", current.replace("[demand]\n", delta + "[demand]\n", 1))
    pushed = json.loads(cli(box, "config", "push", "/tmp/pushed.toml", "--json").stdout)
    assert pushed["proxy"] == {box.name: "reloaded"}, pushed
    with Client(url(box), ["delta"], rounds=1) as client:
        client.join(60)
    assert [a.status for a in client.answers] == [200], client.answers
    # The held request is let through once delta is routed; its deployment ends a moment later.
    delta_runs = wait_for(
        lambda: [d for d in demand_deployments(box) if d["model"] == "delta"],
        lambda ds: ds and all(d["ended_at"] is not None for d in ds),
        timeout=60,
        what="delta's on-demand deployment to end",
    )
    assert [d["outcome"] for d in delta_runs] == ["active"]


@pytest.fixture(scope="module")
def flood_box(box: Host, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    """h1's agent again, now with five models on demand on a box that fits two."""
    host = box
    _teardown(host)
    install_agent(
        host,
        demand_config(host, Path(STATE), FLOOD, max_swaps_per_min=FLOOD_CAP, batch_wait_s=1.0),
        tmp_path_factory.mktemp("flood"),
    )
    cli(host, "switch", "f3")
    yield host
    _teardown(host)


def test_a_flood_for_five_models_fails_only_429_and_ends_serving_the_most_asked(flood_box: Host) -> None:
    """Clients for five models (f1 and f2 asked by three clients each, f3-f5 by one) on a box that fits two:
    nothing fails but 429 with Retry-After, the swaps stay within the cap, and f1 and f2 serve at the end."""
    host = flood_box
    weights = {"f1": 3, "f2": 3, "f3": 1, "f4": 1, "f5": 1}
    clients = [Client(url(host), [m]) for m, n in weights.items() for _ in range(n)]
    for c in clients:
        c.__enter__()
    stop_at = time.monotonic() + FLOOD_S
    wait_for(lambda: time.monotonic() >= stop_at, timeout=FLOOD_S + 5, interval=1.0, what="the flood's end")
    for c in clients:
        c.stop()
    answers = [a for c in clients for a in c.answers]
    swaps = swaps_of(demand_deployments(host))
    by_status: dict[str, int] = {}
    for a in answers:
        by_status[str(a.status)] = by_status.get(str(a.status), 0) + 1
    print(
        f"flood: {len(answers)} requests {by_status}, {len(swaps)} on-demand deployments, "
        f"at most {max_per_minute(swaps)} in a minute; serving {sorted(serving(host))}"
    )
    assert _failures(answers) == []
    assert max_per_minute(swaps) <= FLOOD_CAP
    assert serving(host) == {"f1", "f2"}
