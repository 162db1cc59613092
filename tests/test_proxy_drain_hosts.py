"""Zero downtime under load, repeated: a client-side prober (tests/proxy_prober.py: plain and
streaming completions, continuously, keep-alive connections) goes through the real HAProxy of a
test host while the route moves many times. A stream cut or a failed request in any round fails."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import settings
from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import Route, master_socket, render_config, sha
from orchestrator.deploy.operations import Operations
from orchestrator.errors import ProxyError
from orchestrator.resources import template_text
from orchestrator.wiring import build_ports, operations
from tests.builders.drain import MODELS, TOKENS, ProberProcess, moves, recorder, spanning
from tests.builders.proxy import PROXY_PORT, base_url, proxy_config
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.proxy_prober import classify

pytestmark = pytest.mark.hosts
REPO = Path(__file__).resolve().parents[1]
# Issue 29's acceptance: "0 cut streams and 0 failures across at least 30 handovers" (the racy drain cut
# 4 streams in 30); bench/proxy/proxy_handovers.py runs 40, the figure docs/howto/front-proxy.md quotes.
HANDOVERS = 30


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Iterator[Operations]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(proxy_config(host, tmp_path / "state", MODELS))
    yield operations(settings.load(cfg))
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def drain_figures(drains: list[float]) -> str:
    drains = sorted(drains)
    return f"drain median {drains[len(drains) // 2]:.2f} s, max {drains[-1]:.2f} s" if drains else "no drain"


def summary(requests: list[dict[str, Any]]) -> str:
    got = classify(requests, TOKENS)
    return ", ".join(f"{len(v)} {k}" for k, v in got.items())


def test_30_handovers_under_a_prober_cut_no_stream_and_fail_no_request(host: Host, ops: Operations) -> None:
    """chat-a <-> chat-b (disjoint GPUs) 30 times under continuous plain and streaming traffic:
    every handover ends active, no stream is cut, no request fails or gets a 503."""
    assert ops.switch("chat-a")["outcome"] == "active"
    events: list[tuple[float, str]] = []
    drains: list[float] = []
    outcomes = []
    t0 = time.monotonic()
    with ProberProcess(base_url(host), "chat") as prober:
        for i in range(HANDOVERS):
            outcomes.append(ops.switch(("chat-b", "chat-a")[i % 2], progress=recorder(events, drains))["outcome"])
    took = time.monotonic() - t0
    got = classify(prober.requests, TOKENS)
    print(
        f"{HANDOVERS} handovers in {took:.1f} s: {summary(prober.requests)}; "
        f"{spanning(prober.requests, moves(events))} streams spanned a route move; {drain_figures(drains)}"
    )
    assert outcomes == ["active"] * HANDOVERS
    assert [h["plan"]["mode"] for h in ops.history(host.name)[:HANDOVERS]] == ["handover"] * HANDOVERS
    assert got["cut"] == [] and got["failed"] == [] and got["gap"] == []
    assert len(moves(events)) == HANDOVERS and spanning(prober.requests, moves(events)) >= HANDOVERS


def test_10_stop_starts_under_a_prober_answer_only_503_with_retry_after(host: Host, ops: Operations) -> None:
    """chat-a <-> chat-c (same GPUs) 10 times under the prober: no stream is cut, and the only
    answers other than 200 are 503 with Retry-After while the route is a gap."""
    assert ops.switch("chat-a")["outcome"] == "active"
    events: list[tuple[float, str]] = []
    drains: list[float] = []
    outcomes = []
    with ProberProcess(base_url(host), "chat") as prober:
        for i in range(10):
            outcomes.append(ops.switch(("chat-c", "chat-a")[i % 2], progress=recorder(events, drains))["outcome"])
    got = classify(prober.requests, TOKENS)
    print(
        f"10 stop-starts: {summary(prober.requests)}; "
        f"{spanning(prober.requests, moves(events))} streams spanned a route change; {drain_figures(drains)}"
    )
    assert outcomes == ["active"] * 10
    assert got["cut"] == [] and got["failed"] == []
    assert got["gap"] and {r["retry_after"] for r in got["gap"]} == {"2"}
    assert spanning(prober.requests, moves(events)) >= 10


SHOW_PROC = """
import socket, sys
from orchestrator.core.haproxy_cli import parse_show_proc
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"show proc\\n")
s.shutdown(socket.SHUT_WR)
out = b""
while chunk := s.recv(65536):
    out += chunk
procs = parse_show_proc(out.decode())
print(procs.reloads, procs.failed, ",".join(map(str, procs.workers)))
"""


@pytest.fixture
def proxy(host: Host, tmp_path: Path) -> Iterator[tuple[HaproxyProxy, Catalog]]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(proxy_config(host, tmp_path / "state", MODELS))
    catalog = settings.load(cfg)
    port = build_ports(catalog, catalog.hosts[host.name]).proxy
    assert isinstance(port, HaproxyProxy)
    yield port, catalog
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def rendered(catalog: Catalog, host: Host, routes: list[Route]) -> str:
    return render_config(catalog.proxy, host.address, routes, template_text("haproxy.cfg.j2"))


def master(host: Host, catalog: Catalog) -> tuple[int, int, set[int]]:
    reloads, failed, workers = host.run_python(SHOW_PROC, master_socket(catalog.proxy)).stdout.split(" ")
    return int(reloads), int(failed), {int(w) for w in workers.split(",") if w.strip()}


def test_a_reload_returns_once_the_master_lists_the_new_configs_worker(
    host: Host, proxy: tuple[HaproxyProxy, Catalog]
) -> None:
    """apply() of a changed config: when it returns, the master counted the reload and lists a
    worker that was not there before (the drain can tell old workers from the new one)."""
    port, catalog = proxy
    assert port.apply_config(rendered(catalog, host, [Route("chat", host.address, 8101)]))
    before = master(host, catalog)
    for i in range(5):
        assert port.apply_config(rendered(catalog, host, [Route("chat", host.address, 8102 + i)]))
        after = master(host, catalog)
        assert after[0] == before[0] + 1 and after[2] - before[2], (before, after)
        before = after


def test_a_reload_the_master_refuses_fails_naming_the_config_and_the_old_one_serves(
    host: Host, proxy: tuple[HaproxyProxy, Catalog]
) -> None:
    """A config that passes `haproxy -c` but cannot be loaded (its extra bind is taken): ProxyError
    naming the config, no `.applied` update, and the proxy keeps answering with the old config."""
    port, catalog = proxy
    good = rendered(catalog, host, [Route("chat", host.address, 8101)])
    assert port.apply_config(good)
    host.run(
        ["systemd-run", "--unit=port-squatter", sys.executable, "-m", "http.server", "--bind", host.address, "8199"]
    )
    wait_for(
        lambda: host.run(["ss", "-Hltn", "( sport = :8199 )"]).stdout,
        lambda out: bool(out.strip()),
        what="the squatter to listen",
    )
    bad = good + f"\nfrontend extra\n    bind {host.address}:8199\n    default_backend no_route\n"
    with pytest.raises(ProxyError, match=f"could not load {catalog.proxy.config_path} on reload"):
        port.apply_config(bad)
    assert httpx.get(f"http://{host.address}:{PROXY_PORT}/health", timeout=10).status_code == 200
    applied = host.run(["cat", catalog.proxy.config_path + ".applied"]).stdout.strip()
    assert applied == sha(good)


def test_a_unit_whose_master_socket_moved_is_restarted_and_then_serves(
    host: Host, proxy: tuple[HaproxyProxy, Catalog], tmp_path: Path
) -> None:
    """[proxy] stats_socket moved to another socket: the running master does not listen there,
    so a reload could never be confirmed; the proxy restarts on the new unit and answers."""
    port, catalog = proxy
    assert port.apply_config(rendered(catalog, host, [Route("chat", host.address, 8101)]))
    cfg = tmp_path / "moved.toml"
    cfg.write_text(
        proxy_config(host, tmp_path / "state", MODELS) + 'stats_socket = "/run/orchestrator-proxy/moved.sock"\n'
    )
    moved_catalog = settings.load(cfg)
    moved = build_ports(moved_catalog, moved_catalog.hosts[host.name]).proxy
    assert isinstance(moved, HaproxyProxy)
    assert moved.apply_config(rendered(moved_catalog, host, [Route("chat", host.address, 8102)]))
    assert master(host, moved_catalog)[2]
    assert httpx.get(f"http://{host.address}:{PROXY_PORT}/health", timeout=10).status_code == 200


def test_stop_frees_the_port_and_disables_the_unit_and_apply_starts_it_again(
    host: Host, proxy: tuple[HaproxyProxy, Catalog]
) -> None:
    """stop(): unit inactive and disabled, port free, a second stop says not running; apply starts it again."""
    port, catalog = proxy
    config = rendered(catalog, host, [Route("chat", host.address, 8101)])
    assert port.apply_config(config)
    assert port.stop() is True
    state = host.run(
        "systemctl is-active orchestrator-proxy.service; systemctl is-enabled orchestrator-proxy.service", check=False
    ).stdout.split()
    assert state == ["inactive", "disabled"]
    assert port.port_holder() is None and port.stop() is False
    assert port.apply_config(config)
    assert httpx.get(f"http://{host.address}:{PROXY_PORT}/health", timeout=10).status_code == 200


def slow_clients(host: Host) -> list[socket.socket]:
    """Two clients of chat through the proxy that sent a request's headers, one also half its body,
    and then nothing (a client on a slow link, or one that stalls)."""
    body = json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host.address}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    clients = []
    for sent in (head, head + body[: len(body) // 2]):
        sock = socket.create_connection((host.address, PROXY_PORT), timeout=30)
        sock.sendall(sent)
        clients.append(sock)
    return clients


def finish(sock: socket.socket, sent_body: int) -> bytes:
    """Send the rest of the slow client's body; its answer's status line and headers."""
    body = json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode()
    sock.sendall(body[sent_body:])
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
        answer += chunk
    return answer


def drained_events(into: list[dict[str, Any]]) -> Any:
    return lambda event, fields: into.append(fields) if event == "drained" else None


def test_clients_that_sent_only_headers_or_half_a_body_hold_no_drain(host: Host, ops: Operations) -> None:
    """chat-a -> chat-b while two clients of chat-a's proxy worker stall mid-request: the drain of
    chat-a ends with nothing left draining, not at drain_timeout_s (20 s here)."""
    assert ops.switch("chat-a")["outcome"] == "active"
    clients = slow_clients(host)
    drains: list[dict[str, Any]] = []
    try:
        assert ops.switch("chat-b", progress=drained_events(drains))["outcome"] == "active"
    finally:
        for sock in clients:
            sock.close()
    print(f"drain with two stalled clients: {drains}")
    assert [d["still_draining"] for d in drains] == [0]
    assert drains[0]["seconds"] < 20


def test_a_stalled_request_completed_after_the_drain_goes_to_the_current_route(host: Host, ops: Operations) -> None:
    """The stalled clients finish their bodies once chat-a has stopped: the old proxy worker sends them
    through the current one, and chat-b answers 200 (not a reset, not chat-a's refused port)."""
    assert ops.switch("chat-a")["outcome"] == "active"
    headers_only, half = slow_clients(host)
    body_len = len(json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode())
    assert ops.switch("chat-b")["outcome"] == "active"
    assert (
        "vllm-chat-a.service"
        not in host.run("systemctl list-units --state=active --plain --no-legend", check=False).stdout
    )
    with headers_only, half:
        answers = [finish(headers_only, 0), finish(half, body_len // 2)]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 200 OK"] * 2, answers


def test_stalled_clients_do_not_hold_the_sleep_of_a_warm_switch(host: Host, tmp_path: Path) -> None:
    """alpha -> beta on the same GPUs, alpha put to sleep (the issue's case: sleeping phases of 22.7 s),
    with two clients of alpha's proxy worker stalled mid-request: every drain ends with nothing left
    draining, not at drain_timeout_s (20 s here)."""
    from tests.test_warm_hosts import residency, warm_config

    cfg = tmp_path / "deploy.toml"
    cfg.write_text(warm_config(host, tmp_path / "state"))
    ops = operations(settings.load(cfg))
    try:
        assert ops.switch("alpha")["outcome"] == "active"
        clients = slow_clients(host)
        drains: list[dict[str, Any]] = []
        try:
            assert ops.switch("beta", progress=drained_events(drains))["outcome"] == "active"
        finally:
            for sock in clients:
                sock.close()
        print(f"warm switch drains with two stalled clients: {drains}")
        assert drains and all(d["still_draining"] == 0 and d["seconds"] < 20 for d in drains)
        assert residency(ops, host) == {"alpha": "asleep", "beta": "serving"}
    finally:
        host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def test_stalled_clients_do_not_hold_the_quiet_wait_of_a_warm_switch(host: Host, tmp_path: Path) -> None:
    """beta serving, alpha asleep, two clients of beta's proxy worker stalled mid-request: `switch alpha`
    (warm) finds beta quiet at once (a connection with no request at the engine is no session), not at
    quiet_wait_s, and its drain ends with nothing left."""
    from tests.test_warm_hosts import residency, warm_config

    cfg = tmp_path / "deploy.toml"
    cfg.write_text(warm_config(host, tmp_path / "state"))
    ops = operations(settings.load(cfg))
    try:
        assert ops.switch("alpha")["outcome"] == "active"
        assert ops.switch("beta")["outcome"] == "active"
        clients = slow_clients(host)
        seen: list[tuple[str, dict[str, Any]]] = []
        try:
            result = ops.switch(
                "alpha", progress=lambda e, f: seen.append((e, f)) if e in ("quiet", "drained") else None
            )
        finally:
            for sock in clients:
                sock.close()
        print(f"warm switch with two stalled clients: {seen}")
        assert result["outcome"] == "active", result.get("error")
        assert [(e, f.get("outcome", f.get("still_draining"))) for e, f in seen] == [("quiet", "quiet"), ("drained", 0)]
        assert residency(ops, host) == {"alpha": "serving", "beta": "asleep"}
    finally:
        host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)
