"""The real engine end to end: vLLM (CPU build) on a systemd test host, driven by the same template
as GPU hosts, checked with the official `openai` client.

One test, one host and one engine lifetime for three behaviours, each its own check below: every
real engine start costs ~20 s of CPU on this machine, and the second behaviour begins where the
first ends (tiny-b serving), so a test of its own would only start tiny-b again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.deploy.operations import Operations
from orchestrator.wiring import operations
from tests.e2e.vllm_config import active, complete, vllm_config_text
from tests.hosts.machine import Host

MODELS = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")

pytestmark = [pytest.mark.hosts, pytest.mark.vllm]


def switch_a_then_b_then_broken_rolls_back_to_b(host: Host, ops: Operations) -> None:
    """tiny-a -> tiny-b -> tiny-broken rolls back to tiny-b; each serves real completions."""
    assert ops.switch("tiny-a")["outcome"] == "active"
    complete(host, 8201, "tiny-a")
    assert active(host, "vllm-tiny-a.service") == "active"

    assert ops.switch("tiny-b")["outcome"] == "active"
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-a.service"), active(host, "vllm-tiny-b.service")) == ("inactive", "active")

    broken = ops.switch("tiny-broken")
    assert broken["outcome"] == "rolled_back", broken
    assert "vllm-tiny-broken.service" in broken["error"]
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-b.service"), active(host, "vllm-tiny-broken.service")) == ("active", "inactive")


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
        ("tiny-unservable", "rolled_back"), ("tiny-broken", "rolled_back"), ("tiny-b", "active"), ("tiny-a", "active")]
    for h in history:
        timed = {p["phase"]: p["seconds"] for p in h["phases"]}
        assert timed["checking"] is not None and timed["starting"] is not None
    print("phase timings:", [(h["model"], {p["phase"]: round(p["seconds"], 2) for p in h["phases"]})
                             for h in history])


def test_switch_real_vllm_models_and_roll_back_from_broken_and_unservable_ones(host: Host, tmp_path: Path) -> None:
    """tiny-a -> tiny-b -> tiny-broken rolls back to tiny-b; tiny-unservable (health 200, every completion
    failing) rolls back to tiny-b with the engine's error; history has it all."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(vllm_config_text(host, tmp_path / "state", MODELS))
    ops = operations(settings.load(cfg))
    switch_a_then_b_then_broken_rolls_back_to_b(host, ops)
    health_200_but_every_completion_failing_rolls_back_with_the_engine_error(host, ops)
    history_has_every_switch_with_its_phase_timings(host, ops)
