"""Warm switches on a test host: the stand-in engine with vLLM's sleep API (cold load 0.5 s, wake
0.3 s), real systemd, the real HAProxy in front, the stand-in nvidia-smi showing sleepers' residue."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import settings
from orchestrator.core.records import Deployment
from orchestrator.deploy.operations import Operations
from orchestrator.wiring import operations
from tests.builders.drain import TOKENS, ProberProcess
from tests.builders.proxy import base_url, proxy_config
from tests.builders.proxy_state import proxy_state
from tests.hosts.machine import Host, in_host
from tests.proxy_prober import classify

pytestmark = pytest.mark.hosts
ENGINE = ["--load-time", "2", "--wake-time", "0.3", "--sleep-time", "0.1", "--chunk-delay", "0.02"]
# These tests tell a wake from a cold start by the phases and the engine's pid, not by time: a cold
# load of 0.5 s (ENGINE's 2 s stays for test_demand_idle_hosts, which imports it) saves ~1.5 s a start.
COLD_FAST = ["--load-time", "0.5", *ENGINE[2:]]
WARM = {"served_name": "chat", "sleep": "level1", "wake_deadline_s": 5, "args": COLD_FAST}
MODELS: dict[str, dict[str, Any]] = {
    "alpha": {"port": 8121, **WARM},
    "beta": {"port": 8122, **WARM},
    "gamma": {"port": 8123, **WARM, "args": [*COLD_FAST, "--sleep-keeps-memory"]},
}


def warm_config(host: Host, state: Path, sleep_ram_gib: float = 8) -> str:
    text = proxy_config(host, state, MODELS)
    return text.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\nsleep_ram_gib = {sleep_ram_gib}\n", 1)


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Iterator[Operations]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(warm_config(host, tmp_path / "state"))
    yield operations(settings.load(cfg))
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def chat(host: Host) -> httpx.Response:
    """One completion for "chat" through the front proxy."""
    return httpx.post(
        f"{base_url(host)}/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2}, timeout=10
    )


def engine_url(host: Host, model: str) -> str:
    return f"http://{host.address}:{MODELS[model]['port']}"


def sleeping(host: Host, model: str) -> bool:
    return bool(httpx.get(f"{engine_url(host, model)}/is_sleeping", timeout=5).json()["is_sleeping"])


def residency(ops: Operations, host: Host) -> dict[str, str]:
    res = ops.status(host.name)["hosts"][host.name]["residency"]
    return {m["model"]: m["state"] for m in res["models"] if m["state"] != "stopped"}


def phases(ops: Operations, host: Host) -> list[str]:
    return [t["phase"] for t in ops.history(host.name, 1)[0]["phases"]]


def test_a_b_a_the_second_a_is_warm_and_the_prober_sees_no_failure(host: Host, ops: Operations) -> None:
    """alpha -> beta (alpha sleeps) -> alpha (woken, not started) under the prober through the proxy:
    every request of the warm swap answers 200, none cut, none 503."""
    assert ops.switch("alpha")["outcome"] == "active"
    assert ops.switch("beta")["outcome"] == "active"
    assert residency(ops, host) == {"alpha": "asleep", "beta": "serving"} and sleeping(host, "alpha")
    pid_before = host.run("systemctl show -p MainPID --value vllm-alpha.service").stdout.strip()
    t0 = time.monotonic()
    with ProberProcess(base_url(host), "chat") as prober:
        result = ops.switch("alpha")
    took = time.monotonic() - t0
    assert result["outcome"] == "active", result.get("error")
    assert phases(ops, host)[-4:] == ["sleeping", "verifying", "waking", "routing"]
    assert host.run("systemctl show -p MainPID --value vllm-alpha.service").stdout.strip() == pid_before
    got = classify(prober.requests, TOKENS)
    print(
        f"warm swap in {took:.2f} s: {len(got['ok'])} ok, {len(got['cut'])} cut, {len(got['gap'])} 503, "
        f"{len(got['failed'])} failed"
    )
    assert got["failed"] == [] and got["cut"] == [] and got["gap"] == []
    assert residency(ops, host) == {"alpha": "serving", "beta": "asleep"} and sleeping(host, "beta")
    assert not sleeping(host, "alpha")


def test_a_stream_on_the_displaced_engine_holds_the_route_not_the_gap(host: Host, ops: Operations) -> None:
    """beta streams 64 tokens (1.3 s) through the proxy as `switch alpha` begins: the route waits for a
    quiet moment (beta still serves the stream), then moves, so beta's drain finds nothing to wait for;
    the stream ends whole."""
    assert ops.switch("alpha")["outcome"] == "active"
    assert ops.switch("beta")["outcome"] == "active"
    chunks: list[str] = []

    def stream() -> None:
        body = {"model": "chat", "prompt": "hi", "max_tokens": 64, "stream": True}
        with httpx.stream("POST", f"{base_url(host)}/completions", json=body, timeout=30) as r:
            chunks.extend(line for line in r.iter_lines() if line.startswith("data: "))

    client = threading.Thread(target=stream)
    client.start()
    time.sleep(0.3)  # the stream is in flight at beta (64 tokens at 20 ms: 1.28 s)
    events: list[tuple[str, dict[str, Any]]] = []
    result = ops.switch("alpha", progress=lambda e, f: events.append((e, f)) if e in ("quiet", "drained") else None)
    client.join(timeout=30)
    assert result["outcome"] == "active", result.get("error")
    print(f"quiet wait and drain with a stream on the displaced engine: {events}")
    (_, quiet), (_, drained) = events
    assert quiet["outcome"] == "quiet" and quiet["seconds"] > 0.3
    assert drained["still_draining"] == 0 and drained["seconds"] < quiet["seconds"]
    assert chunks[-1] == "data: [DONE]" and len(chunks) > 64


def test_a_warm_switch_moves_the_route_without_a_reload_and_the_file_routes_as_the_proxy(
    host: Host, ops: Operations
) -> None:
    """beta -> alpha (same served name) under the prober: HAProxy's reload count and worker are the same
    after the switch, the running worker sends "chat" to alpha alone, and the config file on disk says
    so (its servers' states are the worker's, its hash applied): a later reload routes the same."""
    assert ops.switch("alpha")["outcome"] == "active"
    assert ops.switch("beta")["outcome"] == "active"
    before = proxy_state(host)
    assert before.file_matches_running and [a.rsplit(":", 1)[1] for a in before.serving()] == ["8122"]
    with ProberProcess(base_url(host), "chat") as prober:
        result = ops.switch("alpha")
    assert result["outcome"] == "active", result.get("error")
    after = proxy_state(host)
    print(f"reloads {before.reloads} -> {after.reloads}, workers {before.workers} -> {after.workers}")
    assert (after.reloads, after.workers) == (before.reloads, before.workers)
    assert after.file_matches_running and [a.rsplit(":", 1)[1] for a in after.serving()] == ["8121"]
    got = classify(prober.requests, TOKENS)
    assert got["failed"] == [] and got["cut"] == [] and got["gap"] == []


def test_a_stream_in_flight_when_the_route_moves_at_runtime_holds_the_sleep_and_ends_whole(
    host: Host, tmp_path: Path
) -> None:
    """quiet_wait_s = 0: the route moves off beta (runtime API, no reload) while beta streams 64 tokens;
    the drain counts the stream in the running worker and waits for it, beta sleeps after, the stream
    ends whole."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(warm_config(host, tmp_path / "state") + "quiet_wait_s = 0\n")
    ops = operations(settings.load(cfg))
    try:
        assert ops.switch("alpha")["outcome"] == "active"
        assert ops.switch("beta")["outcome"] == "active"
        before = proxy_state(host)
        chunks: list[str] = []

        def stream() -> None:
            body = {"model": "chat", "prompt": "hi", "max_tokens": 64, "stream": True}
            with httpx.stream("POST", f"{base_url(host)}/completions", json=body, timeout=30) as r:
                chunks.extend(line for line in r.iter_lines() if line.startswith("data: "))

        client = threading.Thread(target=stream)
        client.start()
        time.sleep(0.3)  # the stream is in flight at beta (64 tokens at 20 ms: 1.28 s)
        events: list[dict[str, Any]] = []
        result = ops.switch("alpha", progress=lambda e, f: events.append(f) if e == "drained" else None)
        client.join(timeout=30)
        assert result["outcome"] == "active", result.get("error")
        print(f"drain of a stream left in the running worker: {events}")
        assert events[0]["still_draining"] == 0 and events[0]["seconds"] > 0.3
        assert chunks[-1] == "data: [DONE]" and len(chunks) > 64
        assert proxy_state(host).reloads == before.reloads
    finally:
        host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def test_a_wedged_wake_is_restarted_cold_with_the_engines_error_in_history(host: Host, ops: Operations) -> None:
    """alpha asleep is woken behind the product's back while beta holds the GPU (vLLM: 500 out of
    memory, half-woken); switching to alpha wakes it, gets vLLM's 500, kills and restarts it cold."""
    ops.switch("alpha")
    ops.switch("beta")
    r = httpx.post(f"{engine_url(host, 'alpha')}/wake_up", timeout=10)
    assert r.status_code == 500 and "out of memory" in r.text
    result = ops.switch("alpha")
    assert result["outcome"] == "active", result.get("error")
    assert "restarting" in phases(ops, host)
    assert "CUDA Error" in (ops.history(host.name, 1)[0]["error"] or "")
    assert residency(ops, host) == {"alpha": "serving", "beta": "asleep"}


def test_a_sleep_that_keeps_its_memory_is_stopped_instead(host: Host, ops: Operations) -> None:
    """gamma's sleep answers 200 and frees nothing: gamma is stopped, and the switch to alpha ends active."""
    ops.switch("alpha")
    ops.switch("gamma")  # alpha sleeps
    result = ops.switch("alpha")
    assert result["outcome"] == "active", result.get("error")
    assert residency(ops, host) == {"alpha": "serving"}
    assert host.run("systemctl is-active vllm-gamma.service", check=False).stdout.strip() == "inactive"
    warm = ops.store.events(host=host.name, kind="warm", limit=50)
    assert any(e["step"] == "sleep_failed" and e["model"] == "gamma" and "MiB on GPU" in e["error"] for e in warm)


def test_ram_budget_full_stops_the_oldest_sleeper(host: Host, tmp_path: Path) -> None:
    """Room in host RAM for one sleeper (1 GiB of weights each, a 1.5 GiB budget): switching to the
    third model stops the least recently served sleeper."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(warm_config(host, tmp_path / "state", sleep_ram_gib=1.5))
    ops = operations(settings.load(cfg))
    try:
        for name in ("alpha", "beta"):
            spec = ops.deployer().spec_for(ops.catalog.models[name])
            host.run(f"mkdir -p {spec.model_dir} && truncate -s 1G {spec.model_dir}/weights.bin")
        ops.switch("alpha")
        ops.switch("beta")
        assert residency(ops, host) == {"alpha": "asleep", "beta": "serving"}
        result = ops.switch("gamma")
        assert result["outcome"] == "active", result.get("error")
        assert residency(ops, host) == {"beta": "asleep", "gamma": "serving"}
        evicted = [e for e in ops.store.events(host=host.name, kind="warm", limit=50) if e["step"] == "evicted"]
        assert [e["model"] for e in evicted] == ["alpha"]
    finally:
        host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def test_rollback_of_a_warm_switch_is_warm(host: Host, ops: Operations) -> None:
    """alpha's wake wedges and its cold restart fails (its unit broken meanwhile): beta, asleep, is
    woken back, not started, and serves again; alpha is stopped."""
    ops.switch("alpha")
    ops.switch("beta")
    httpx.post(f"{engine_url(host, 'alpha')}/wake_up", timeout=10)  # wedged: 500 out of memory
    beta_pid = host.run("systemctl show -p MainPID --value vllm-beta.service").stdout.strip()

    def break_alpha(dep: Deployment) -> None:
        if dep.phase.value == "restarting":
            host.run(
                "sed -i 's|^ExecStart=.*|ExecStart=/bin/false|' /etc/systemd/system/vllm-alpha.service"
                " && systemctl daemon-reload"
            )

    ops.before_step = break_alpha
    result = ops.switch("alpha")
    assert result["outcome"] == "rolled_back", result
    assert host.run("systemctl show -p MainPID --value vllm-beta.service").stdout.strip() == beta_pid
    assert residency(ops, host) == {"beta": "serving"} and not sleeping(host, "beta")
    r = httpx.post(f"{base_url(host)}/completions", json={"model": "chat", "prompt": "hi", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200


def test_a_wedged_wake_restarts_with_the_proxy_answering_503_and_retry_after(host: Host, ops: Operations) -> None:
    """While the wedged alpha restarts cold and is checked, "chat" gets the proxy's own 503 with
    Retry-After (code model_switching) through the real HAProxy, not the starting engine's answers;
    once alpha serves, the route is back on it."""
    ops.switch("alpha")
    ops.switch("beta")
    httpx.post(f"{engine_url(host, 'alpha')}/wake_up", timeout=10)  # wedged: 500 out of memory
    seen: list[tuple[int, str | None, str]] = []

    def probe(dep: Deployment) -> None:
        if dep.phase.value == "checking" and not seen:
            r = chat(host)
            seen.append((r.status_code, r.headers.get("retry-after"), r.text))

    ops.before_step = probe
    result = ops.switch("alpha")
    assert result["outcome"] == "active", result.get("error")
    assert "restarting" in phases(ops, host)
    assert [(code, after) for code, after, _ in seen] == [(503, "2")] and '"model_switching"' in seen[0][2]
    assert chat(host).status_code == 200


def test_a_wake_that_cannot_fit_beside_a_foreign_process_is_refused_before_alpha_sleeps(
    host: Host, ops: Operations
) -> None:
    """A foreign process holds 8 GiB on alpha's and beta's GPUs: `switch beta` is refused at staging
    (aborted) naming its PID, the MiB it holds and the MiB beta's wake needs; alpha never slept and
    still answers through the proxy."""
    ops.switch("beta")
    ops.switch("alpha")  # beta sleeps, alpha serves
    stray = host.run(
        [
            "systemd-run",
            "--unit=stray-gpu-holder",
            "--property=Type=exec",
            in_host(sys.executable),
            in_host(Path(__file__).parent / "standin/openai_server.py"),
            "--host",
            host.address,
            "--port",
            "8199",
            "--served-name",
            "stray",
            "--gpus",
            "0,1,2,3",
            "--gpu-mib",
            "8192",
        ]
    )
    assert stray.returncode == 0
    try:
        pid = host.run("systemctl show -p MainPID --value stray-gpu-holder.service").stdout.strip()
        result = ops.switch("beta")
        assert result["outcome"] == "aborted", result
        assert f"PID {pid} " in result["error"] and "holds 8192 MiB on GPU 0" in result["error"]
        assert "the wake needs" in result["error"] and "nothing was put to sleep" in result["error"]
        assert residency(ops, host) == {"alpha": "serving", "beta": "asleep"} and not sleeping(host, "alpha")
        assert chat(host).status_code == 200
    finally:
        host.run(["systemctl", "stop", "stray-gpu-holder.service"], check=False)


# Two models on the same GPUs that fit awake together (97,887 MiB each GPU): 0.6 and 0.3 of it, each
# engine holding a little over its share, as vLLM does.
BESIDE: dict[str, dict[str, Any]] = {
    "big": {"port": 8124, **WARM, "gpu_memory_utilization": 0.6},
    "small": {"port": 8125, **WARM, "gpu_memory_utilization": 0.3},
}
BESIDE_MIB = {"big": 59_000, "small": 29_700}


def test_a_cold_switch_to_a_model_that_fits_beside_has_no_gap(host: Host, tmp_path: Path) -> None:
    """big -> small on the same GPUs, both fit awake: small starts beside big, the route moves, big
    sleeps; through the real HAProxy no request fails, none is cut, none gets a 503."""
    text = proxy_config(host, tmp_path / "state", BESIDE).replace(
        f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\nsleep_ram_gib = 8\n", 1
    )
    for name, mib in BESIDE_MIB.items():
        text = text.replace(f"[models.{name}]\n", f'[models.{name}]\nenv = {{ STANDIN_GPU_MIB = "{mib}" }}\n', 1)
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(text)
    ops = operations(settings.load(cfg))
    try:
        assert ops.switch("big")["outcome"] == "active"
        plan = ops.explain("small")
        assert plan["mode"] == "beside", plan["reason"]
        with ProberProcess(base_url(host), "chat") as prober:
            result = ops.switch("small")
        assert result["outcome"] == "active", result.get("error")
        assert ops.history(host.name, 1)[0]["plan"]["mode"] == "beside"
        got = classify(prober.requests, TOKENS)
        print(
            f"beside switch: {len(got['ok'])} ok, {len(got['cut'])} cut, {len(got['gap'])} 503, "
            f"{len(got['failed'])} failed"
        )
        assert got["failed"] == [] and got["cut"] == [] and got["gap"] == []
        assert residency(ops, host) == {"big": "asleep", "small": "serving"}
    finally:
        host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)
