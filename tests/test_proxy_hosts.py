"""The front proxy on real test hosts: HAProxy as orchestrator-proxy.service bound to the host's
loopback address, stand-in engines behind it, clients going through it only."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from orchestrator import settings
from orchestrator.deploy.operations import Operations
from orchestrator.wiring import operations
from tests.builders.proxy import MODELS, PROXY_PORT, TP4, Prober, base_url, proxy_config
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_switch_hosts import unit_states

pytestmark = pytest.mark.hosts
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Iterator[Operations]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(proxy_config(host, tmp_path / "state"))
    yield operations(settings.load(cfg))
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def stream(url: str, model: str, tokens: int, out: list[tuple[int, str | None]]) -> None:
    """One streaming completion; appends (chunks received, finish_reason)."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    chunks, finish = 0, None
    for chunk in client.completions.create(model=model, prompt="hi", max_tokens=tokens, stream=True):
        chunks += 1
        finish = chunk.choices[0].finish_reason or finish
    out.append((chunks, finish))


def test_two_models_serve_through_one_port_with_the_openai_client(host: Host, ops: Operations) -> None:
    """chat and code on disjoint GPUs, both reached by name through :8000 with the openai client."""
    assert ops.switch("chat-a")["outcome"] == "active"
    assert ops.switch("code")["outcome"] == "active"
    client = openai.OpenAI(base_url=base_url(host), api_key="unused", max_retries=0)
    assert sorted(m.id for m in client.models.list()) == ["chat", "code"]
    for name in ("chat", "code"):
        assert client.completions.create(model=name, prompt="hi", max_tokens=2).model == name
        chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert chat.model == name
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert err.value.body is not None and err.value.body["code"] == "model_not_found"  # type: ignore[index]
    entry = ops.status(host.name)["hosts"][host.name]
    assert [m["model"] for m in entry["models"]] == ["chat-a", "code"]
    assert entry["endpoint"] == base_url(host)


def test_a_1mb_prompt_with_model_last_reaches_each_model_through_the_installed_proxy(
    host: Host, ops: Operations
) -> None:
    """Keys sorted (``messages`` before ``model``), 1 MB: the proxy unit routes it to each model by name."""
    assert ops.switch("chat-a")["outcome"] == "active"
    assert ops.switch("code")["outcome"] == "active"
    for name in ("chat", "code"):
        body = json.dumps(
            {"messages": [{"role": "user", "content": "x" * 1_000_000}], "max_tokens": 2, "model": name}, sort_keys=True
        )
        answer = httpx.post(
            f"{base_url(host)}/chat/completions", content=body, headers={"Content-Type": "application/json"}, timeout=30
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == name


def test_disjoint_switch_has_no_failed_request_and_streams_finish(host: Host, ops: Operations) -> None:
    """chat-a -> chat-b (disjoint GPUs) under a 50 ms prober and 3 long streams: 0 failures."""
    ops.switch("chat-a")
    streams: list[tuple[int, str | None]] = []
    with Prober(base_url(host), "chat") as prober:
        threads = [threading.Thread(target=stream, args=(base_url(host), "chat", 80, streams)) for _ in range(3)]
        for t in threads:
            t.start()
        result = ops.switch("chat-b")
        for t in threads:
            t.join()
        seen = len(prober.answers)
        wait_for(lambda: len(prober.answers), lambda n: n >= seen + 3, what="probes after the switch")
    assert result["outcome"] == "active", result.get("error")
    assert [h["plan"]["mode"] for h in ops.history(host.name)] == ["handover", "add"]
    failed = [a for a in prober.answers if a[1] != 200]
    assert failed == []
    assert streams == [(80, "length")] * 3
    assert unit_states(host, "chat-a", "chat-b") == {"chat-a": "inactive", "chat-b": "active"}
    print(f"disjoint switch: {len(prober.answers)} probes, 0 failed, longest gap {prober.max_gap() * 1000:.0f} ms")


def test_overlapping_switch_answers_only_503_with_retry_after_in_the_gap(host: Host, ops: Operations) -> None:
    """chat-a -> chat-c (same GPUs): during the gap every probe gets 503 + Retry-After, never an error."""
    ops.switch("chat-a")
    with Prober(base_url(host), "chat") as prober:
        result = ops.switch("chat-c")
        wait_for(lambda: prober.answers[-1][1], lambda s: s == 200, what="chat to answer again")
    assert result["outcome"] == "active", result.get("error")
    statuses = {s for _, s, _ in prober.answers}
    assert statuses == {200, 503}
    assert {ra for _, s, ra in prober.answers if s == 503} == {"2"}
    print(f"overlapping switch: {sum(1 for a in prober.answers if a[1] == 503)} x 503 in the gap")


def test_rollback_restores_the_set_and_stop_frees_a_model(host: Host, ops: Operations) -> None:
    """{chat-a, code} -> chat-b evicts code; rollback brings back chat-a and code; stop code leaves chat-a."""
    ops.switch("chat-a")
    ops.switch("code")
    ops.switch("chat-b")
    assert [m["model"] for m in ops.status(host.name)["hosts"][host.name]["models"]] == ["chat-b"]
    assert ops.rollback(host.name)["outcome"] == "active"
    assert [m["model"] for m in ops.status(host.name)["hosts"][host.name]["models"]] == ["chat-a", "code"]
    assert unit_states(host, "chat-a", "chat-b", "code") == {"chat-a": "active", "chat-b": "inactive", "code": "active"}
    assert ops.stop("code")["serving"] == ["chat-a"]
    r = httpx.post(f"{base_url(host)}/completions", json={"model": "code", "prompt": "hi"}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"  # a name of the catalog: not 404


def test_taken_proxy_port_aborts_before_anything_stops(host: Host, ops: Operations) -> None:
    """Another process on the proxy's address:port: the switch aborts naming it; nothing is stopped."""
    host.run(
        [
            "systemd-run",
            "--unit=port-squatter",
            sys.executable,
            "-m",
            "http.server",
            "--bind",
            host.address,
            str(PROXY_PORT),
        ]
    )
    wait_for(
        lambda: host.run(["ss", "-Hltn", f"( sport = :{PROXY_PORT} )"]).stdout,
        lambda out: bool(out.strip()),
        what="the squatter to listen",
    )
    result = ops.switch("chat-a")
    assert result["outcome"] == "aborted"
    assert f"port {host.address}:{PROXY_PORT} is already taken" in result["error"]
    assert unit_states(host, "chat-a") == {"chat-a": "inactive"}


def test_overlapping_models_asked_to_serve_together_are_refused(host: Host, tmp_path: Path) -> None:
    """`switch chat-a code-wide`: exit 2 naming both models and the shared GPUs; nothing written."""
    models = {**MODELS, "code-wide": {"port": 8105, "gpus": [2, 3, 4, 5], **TP4}}
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(proxy_config(host, tmp_path / "state", models))
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "switch", "chat-a", "code-wide", "--config", str(cfg), "--local"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert proc.returncode == 2
    assert "chat-a (GPU 0,1,2,3) and code-wide (GPU 2,3,4,5) cannot serve together: both need GPU 2,3" in proc.stderr
    assert not (tmp_path / "state").exists()


def test_dry_run_says_handover_or_stop_start(host: Host, ops: Operations, tmp_path: Path) -> None:
    """After chat-a: chat-b would be a handover (disjoint GPUs), chat-c a stop-start (shared GPUs)."""
    ops.switch("chat-a")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "switch",
            "chat-b",
            "--dry-run",
            "--json",
            "--config",
            str(tmp_path / "deploy.toml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert json.loads(out.stdout)[0]["mode"] == "handover", out.stderr
    assert ops.explain("chat-c")["mode"] == "stop_start"
    assert "GPU 0,1,2,3" in ops.explain("chat-c")["reason"]
