"""The real engine end to end: vLLM (CPU build) on a systemd test host, driven by the same template
as GPU hosts, checked with the official `openai` client."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.wiring import operations
from tests.e2e.vllm_config import active, complete, vllm_config_text
from tests.hosts.machine import Host

MODELS = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")

pytestmark = [pytest.mark.hosts, pytest.mark.vllm]


def test_switch_real_vllm_models_and_roll_back_from_a_broken_one(host: Host, tmp_path: Path) -> None:
    """tiny-a -> tiny-b -> tiny-broken rolls back to tiny-b; each serves real completions; history has it all."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(vllm_config_text(host, tmp_path / "state", MODELS))
    ops = operations(settings.load(cfg))

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

    history = ops.history(host.name)
    assert [(h["model"], h["outcome"]) for h in history] == [
        ("tiny-broken", "rolled_back"), ("tiny-b", "active"), ("tiny-a", "active")]
    for h in history:
        timed = {p["phase"]: p["seconds"] for p in h["phases"]}
        assert timed["checking"] is not None and timed["starting"] is not None
    print("phase timings:", [(h["model"], {p["phase"]: round(p["seconds"], 2) for p in h["phases"]})
                             for h in history])


def test_health_200_but_every_completion_failing_rolls_back_with_the_engine_error(host: Host, tmp_path: Path) -> None:
    """tiny-unservable answers /health and /v1/models but fails every completion: rolled back to tiny-b,
    and the error carries the engine's own reason."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(vllm_config_text(host, tmp_path / "state", MODELS))
    ops = operations(settings.load(cfg))
    assert ops.switch("tiny-b")["outcome"] == "active"

    bad = ops.switch("tiny-unservable")
    print("error:", bad.get("error"))
    assert bad["outcome"] == "rolled_back", bad
    assert "vllm-tiny-unservable.service" in bad["error"]
    assert "Unsupported CPU attention configuration: head_dim=16" in bad["error"]
    complete(host, 8202, "tiny-b")
    assert (active(host, "vllm-tiny-b.service"), active(host, "vllm-tiny-unservable.service")) == ("active", "inactive")
    assert [(h["model"], h["outcome"]) for h in ops.history(host.name)] == [
        ("tiny-unservable", "rolled_back"), ("tiny-b", "active")]
