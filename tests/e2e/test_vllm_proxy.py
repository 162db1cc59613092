"""Real vLLM (CPU build) behind the front proxy: one endpoint whatever serves, checked with the
official `openai` client."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from orchestrator import settings
from orchestrator.deploy.operations import Operations
from orchestrator.wiring import operations
from tests.e2e.vllm_config import vllm_config_text
from tests.hosts.machine import Host

MODELS = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")
PROXY_PORT = 18300

pytestmark = [pytest.mark.hosts, pytest.mark.vllm]


@pytest.fixture
def ops(host: Host, tmp_path: Path) -> Iterator[Operations]:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(vllm_config_text(host, tmp_path / "state", MODELS)
                   + f"\n[proxy]\nenabled = true\nport = {PROXY_PORT}\ndrain_timeout_s = 20\nretry_after_s = 2\n")
    yield operations(settings.load(cfg))
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)


def test_real_vllm_models_answer_through_one_endpoint_across_a_switch(host: Host, ops: Operations) -> None:
    """tiny-a, then tiny-b after a switch, answer through the proxy's one URL; /v1/models follows;
    a model that does not serve gets the OpenAI-style 404."""
    client = openai.OpenAI(base_url=f"http://{host.address}:{PROXY_PORT}/v1", api_key="unused", timeout=120,
                           max_retries=0)
    assert ops.switch("tiny-a")["outcome"] == "active"
    out = client.completions.create(model="tiny-a", prompt="The quick brown fox", max_tokens=4, temperature=0)
    assert out.model == "tiny-a" and out.usage is not None and out.usage.completion_tokens > 0
    assert [m.id for m in client.models.list()] == ["tiny-a"]

    assert ops.switch("tiny-b")["outcome"] == "active"
    out = client.completions.create(model="tiny-b", prompt="The quick brown fox", max_tokens=4, temperature=0)
    assert out.model == "tiny-b" and out.usage is not None and out.usage.completion_tokens > 0
    assert [m.id for m in client.models.list()] == ["tiny-b"]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="tiny-a", prompt="hi", max_tokens=1)
    assert err.value.code == "model_not_found"
