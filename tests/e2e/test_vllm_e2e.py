"""The real engine end to end: vLLM (CPU build) on a systemd test host, driven by the same template
as GPU hosts, behind the front proxy, checked with the official `openai` client.

One test, one host and one engine lifetime for four behaviours, each its own check below: every
real engine start costs ~20 s of CPU on this machine, and each behaviour begins where the one before
ends (tiny-a, then tiny-b serving), so a test of its own would only start those engines again. The
engines' own ports are asked as well as the proxy's one endpoint: both must follow every switch."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from orchestrator import settings
from orchestrator.deploy.operations import Operations
from orchestrator.wiring import operations
from tests.e2e.vllm_config import active, complete, vllm_config_text
from tests.hosts.machine import Host

MODELS = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")
PROXY_PORT = 18300

pytestmark = [pytest.mark.hosts, pytest.mark.vllm]


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Iterator[Operations]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        vllm_config_text(host, tmp_path / "state", MODELS)
        + f"\n[proxy]\nenabled = true\nport = {PROXY_PORT}\ndrain_timeout_s = 20\nretry_after_s = 2\n"
    )
    yield operations(settings.load(cfg))
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def endpoint(host: Host) -> openai.OpenAI:
    """The proxy's one URL, whatever serves."""
    return openai.OpenAI(
        base_url=f"http://{host.address}:{PROXY_PORT}/v1", api_key="unused", timeout=120, max_retries=0
    )


def the_endpoint_serves(client: openai.OpenAI, model: str) -> None:
    """A real completion of ``model`` through the proxy, and /v1/models lists it alone."""
    out = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=4, temperature=0)
    assert out.model == model and out.usage is not None and out.usage.completion_tokens > 0
    assert [m.id for m in client.models.list()] == [model]


def switch_a_then_b_then_broken_rolls_back_to_b(host: Host, ops: Operations) -> None:
    """tiny-a -> tiny-b -> tiny-broken rolls back to tiny-b; each serves real completions (tiny-a and
    tiny-b through the proxy too)."""
    assert ops.switch("tiny-a")["outcome"] == "active"
    complete(host, 8201, "tiny-a")
    assert active(host, "vllm-tiny-a.service") == "active"
    the_endpoint_serves(endpoint(host), "tiny-a")

    assert ops.switch("tiny-b")["outcome"] == "active"
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-a.service"), active(host, "vllm-tiny-b.service")) == ("inactive", "active")
    the_endpoint_follows_the_switch_and_answers_503_for_the_model_gone(host)

    broken = ops.switch("tiny-broken")
    assert broken["outcome"] == "rolled_back", broken
    assert "vllm-tiny-broken.service" in broken["error"]
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-b.service"), active(host, "vllm-tiny-broken.service")) == ("active", "inactive")


def the_endpoint_follows_the_switch_and_answers_503_for_the_model_gone(host: Host) -> None:
    """After tiny-a -> tiny-b: tiny-b answers through the same URL, /v1/models follows, and tiny-a (in the
    catalog, no longer served) gets an OpenAI-style 503 model_not_loaded; a name the box does not know a 404."""
    client = endpoint(host)
    the_endpoint_serves(client, "tiny-b")
    with pytest.raises(openai.InternalServerError) as gone:
        client.completions.create(model="tiny-a", prompt="hi", max_tokens=1)
    assert gone.value.status_code == 503 and gone.value.code == "model_not_loaded"
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="tiny-z", prompt="hi", max_tokens=1)
    assert err.value.code == "model_not_found"


def health_200_but_every_completion_failing_rolls_back_with_the_engine_error(host: Host, ops: Operations) -> None:
    """From tiny-b serving: tiny-unservable answers /health and /v1/models but fails every completion:
    rolled back to tiny-b, and the error carries the engine's own reason."""
    bad = ops.switch("tiny-unservable")
    print("error:", bad.get("error"))
    assert bad["outcome"] == "rolled_back", bad
    assert "vllm-tiny-unservable.service" in bad["error"]
    assert "Unsupported CPU attention configuration: head_dim=16" in bad["error"]
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-b.service"), active(host, "vllm-tiny-unservable.service")) == ("active", "inactive")


def history_has_every_switch_with_its_phase_timings(host: Host, ops: Operations) -> None:
    """History lists every switch, newest first, each with its checking and starting phases timed."""
    history = ops.history(host.name)
    assert [(h["model"], h["outcome"]) for h in history] == [
        ("tiny-unservable", "rolled_back"),
        ("tiny-broken", "rolled_back"),
        ("tiny-b", "active"),
        ("tiny-a", "active"),
    ]
    for h in history:
        timed = {p["phase"]: p["seconds"] for p in h["phases"]}
        assert timed["checking"] is not None and timed["starting"] is not None
    print("phase timings:", [(h["model"], {p["phase"]: round(p["seconds"], 2) for p in h["phases"]}) for h in history])


def test_switch_real_vllm_models_through_one_endpoint_and_roll_back_from_broken_and_unservable_ones(
    host: Host, ops: Operations
) -> None:
    """tiny-a -> tiny-b (both answering on their ports and through the proxy's one URL, which 404s the
    model gone) -> tiny-broken rolls back to tiny-b; tiny-unservable (health 200, every completion
    failing) rolls back to tiny-b with the engine's error; history has it all."""
    switch_a_then_b_then_broken_rolls_back_to_b(host, ops)
    health_200_but_every_completion_failing_rolls_back_with_the_engine_error(host, ops)
    history_has_every_switch_with_its_phase_timings(host, ops)
