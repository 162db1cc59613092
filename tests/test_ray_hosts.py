"""Real Ray from PyPI across two test hosts in their own network namespaces, from the rendered units.

h1 runs the Ray head and the engine, h2 a Ray worker; the engine is the stand-in in its Ray mode
(tests/standin/ray_engine.py: a placement group of TP x PP GPU bundles, one actor per bundle, as
vLLM's Ray executor does), because real vLLM CPU refuses Ray. Units run as the vllm user, so Ray
comes from venvs of the system python made by scripts/setup.sh (/opt/ray-2.60, and /opt/ray-2.59
for the version mismatch): a venv of a python under /root cannot run as that user.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.wiring import operations
from tests.hosts.machine import Host, in_host
from tests.hosts.pool import HostSet

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "tests" / "standin" / "vllm_compat.py"
RAY = "/opt/ray-2.60"
OTHER_RAY = "/opt/ray-2.59"
RAY_PORT = 6390

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def pair(netns_pair: HostSet) -> list[Host]:
    """The session's pair of hosts in network namespaces (tests/hosts/fixtures.py)."""
    return netns_pair.hosts


@pytest.fixture
def hosts(pair: list[Host]) -> Iterator[list[Host]]:
    """Both hosts, reset after the test (units stopped and removed, h2's route to h1 back)."""
    yield pair
    h1, h2 = pair
    subprocess.run(
        ["ip", "-n", ns(h2), "route", "del", "blackhole", f"{h1.address}/32"], capture_output=True, check=False
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        for fut in [pool.submit(h.reset) for h in pair]:
            fut.result()


def ns(host: Host) -> str:
    assert host.netns is not None
    return Path(host.netns).name


def config_text(h1: Host, h2: Host, state: Path, *, h2_ray: str = RAY, join_timeout: float = 120) -> str:
    hosts = "".join(
        f'[hosts.{h.name}]\ntransport = "ssh"\naddress = "{h.address}"\nbind = "{h.address}"\nssh_port = {h.port}\n'
        f'ssh_key = "{h.key_path}"\nknown_hosts = "{h.known_hosts_path}"\ngpus = 8\ngpu_memory_gib = 96\n'
        f'interface = "thp{h.address.rsplit(".", 1)[1]}"\nnetwork = "ethernet"\npython = "{sys.executable}"\n'
        f'ray = "{ray}/bin/ray"\n'
        for h, ray in ((h1, RAY), (h2, h2_ray))
    )
    return f"""state_dir = "{state}"
[defaults]
engine = ["{RAY}/bin/python", "{in_host(SHIM)}"]
stop_timeout_s = 30
free_timeout_s = 10
health_interval_s = 0.2
load_deadline_s = 90
ray_join_timeout_s = {join_timeout}
# An engine that exits (rayed-too-wide) is judged failed once systemd restarted it: 0.5 s after its
# exit instead of the default 10 s (the switch host tests' value too).
restart_sec = 0.5
{hosts}
[models.solo1]
repo = "test/solo1"
source = "none"
host = "{h1.name}"
port = 8301
gpus = [0]
args = ["--load-time", "0.3"]
[models.solo2]
repo = "test/solo2"
source = "none"
host = "{h2.name}"
port = 8302
gpus = [0]
args = ["--load-time", "0.3"]
[models.rayed]
repo = "test/rayed"
source = "none"
nodes = ["{h1.name}", "{h2.name}"]
backend = "ray"
port = 8310
ray_port = {RAY_PORT}
gpus = [0]
pipeline_parallel = 2
# Small Ray nodes: this machine has 2 cores and 24 GiB for everything.
ray_args = ["--num-cpus", "1", "--object-store-memory", "100000000"]
args = ["--ray-timeout", "30"]
[models.rayed-too-wide]
repo = "test/rayed"
source = "none"
nodes = ["{h1.name}", "{h2.name}"]
backend = "ray"
port = 8311
ray_port = {RAY_PORT}
gpus = [0]
pipeline_parallel = 2
ray_args = ["--num-cpus", "1", "--object-store-memory", "100000000"]
# The engine asks for one GPU more than the cluster has (the stand-in's override of TP x PP).
args = ["--ray-timeout", "5", "--ray-world", "3"]
"""


def gcs_nodes(h1: Host) -> list[dict[str, Any]]:
    """Alive nodes with their resources, straight from the head's GCS (Ray's own client, as root)."""
    code = (
        "import json, ray._raylet as r\n"
        f"c = r.GcsClient(address='{h1.address}:{RAY_PORT}')\n"
        "print(json.dumps([{'ip': n.node_manager_address, 'resources': dict(n.resources_total)}\n"
        "                  for n in c.get_all_node_info().values() if n.state == 0]))"
    )
    out = h1.run(["sh", "-c", f'cd / && exec {RAY}/bin/python -c "$0"', code]).stdout
    return sorted(json.loads(out), key=lambda n: n["ip"])


def get(host: Host, url: str, body: dict[str, Any] | None = None) -> Any:
    """GET (or POST a JSON body) from inside a host: what a client on that network sees."""
    argv = ["curl", "-sf", "--max-time", "10", url]
    if body is not None:
        argv += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    return json.loads(host.run(argv).stdout)


def completes(host: Host, port: int, model: str) -> bool:
    answer = get(
        host, f"http://{host.address}:{port}/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2}
    )
    return bool(answer["choices"][0]["text"])


def state(host: Host, unit: str) -> str:
    return host.run(["systemctl", "is-active", unit], check=False).stdout.strip()


def started_since(host: Host, unit: str, since: float) -> bool:
    """Whether systemd started the unit since ``since`` (epoch): its journal, as a stopped unit's
    timestamps are gone once systemd unloads it."""
    out = host.run(["journalctl", "-u", unit, "--since", f"@{int(since)}", "-o", "cat", "--no-pager"]).stdout
    return any(line.startswith(("Starting ", "Started ")) for line in out.splitlines())


def ray_processes(host: Host) -> str:
    """Ray's daemons left on a host (gcs_server, raylet, agents, workers): none after a stop."""
    return host.run("pgrep -a -u vllm -f 'gcs_server|raylet|ray/dashboard|ray::|default_worker' || true").stdout


def serve_solos(h1: Host, h2: Host, cfg: Path) -> None:
    ops = operations(settings.load(cfg))
    assert ops.switch("solo1")["outcome"] == "active"
    assert ops.switch("solo2")["outcome"] == "active"


def test_ray_cluster_forms_and_standin_engine_places_workers_on_both_hosts(hosts: list[Host], tmp_path: Path) -> None:
    """switch rayed: Ray's GCS sees h1 and h2 with 1 GPU each, the engine's actors run on both, a completion answers."""
    h1, h2 = hosts
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state"))
    events: list[tuple[str, dict[str, Any]]] = []
    result = operations(settings.load(cfg)).switch("rayed", progress=lambda e, f: events.append((e, dict(f))))
    assert result["outcome"] == "active", result.get("error")

    nodes = gcs_nodes(h1)
    assert [(n["ip"], n["resources"]["GPU"], n["resources"]["CPU"]) for n in nodes] == [
        (h1.address, 1.0, 1.0),
        (h2.address, 1.0, 1.0),
    ]
    [(_, cluster)] = [(e, f) for e, f in events if e == "ray_cluster"]
    print(
        "ray cluster:",
        cluster,
        "RSS MiB of the vllm user:",
        [h.run("ps -u vllm -o rss= | awk '{s+=$1} END {print int(s/1024)}'").stdout.strip() for h in hosts],
    )
    assert len(cluster["nodes"]) == 2 and all("1 GPU, 1 CPU" in n for n in cluster["nodes"])

    workers = get(h1, f"http://{h1.address}:8310/standin/ray")["workers"]
    assert sorted((w["rank"], w["ip"]) for w in workers) == [(0, h1.address), (1, h2.address)]
    assert completes(h1, 8310, "rayed")
    journal = h1.run(["journalctl", "-u", "vllm-rayed.service", "--no-pager"]).stdout
    assert f"rank 0 on {h1.address} (GPU 0), rank 1 on {h2.address} (GPU 0)" in journal
    assert (state(h1, "ray-rayed-head.service"), state(h2, "ray-rayed-worker.service")) == ("active", "active")


def test_worker_with_another_ray_version_is_refused_before_anything_stops(hosts: list[Host], tmp_path: Path) -> None:
    """h2 has Ray 2.59: switch exits non-zero naming both nodes and versions; solo1 and solo2 keep serving."""
    h1, h2 = hosts
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state"))
    serve_solos(h1, h2, cfg)
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(config_text(h1, h2, tmp_path / "state", h2_ray=OTHER_RAY))
    since = time.time()
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "switch", "rayed", "--config", str(mixed)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert r.returncode != 0
    message = r.stdout + r.stderr
    assert f"{h1.name} has Ray 2.60.0" in message and f"{h2.name} has Ray 2.59.0" in message, message
    assert completes(h1, 8301, "solo1") and completes(h2, 8302, "solo2")
    assert (state(h1, "vllm-solo1.service"), state(h2, "vllm-solo2.service")) == ("active", "active")
    for host, unit in ((h1, "ray-rayed-head.service"), (h2, "ray-rayed-worker.service"), (h1, "vllm-rayed.service")):
        assert not started_since(host, unit, since), f"{unit} on {host.name} was started"


def test_unreachable_head_fails_before_the_engine_and_restores_both_nodes(hosts: list[Host], tmp_path: Path) -> None:
    """h2 cannot reach h1 (blackhole route): the join wait fails, no engine ran, solo1/solo2 serve, no Ray left."""
    h1, h2 = hosts
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state", join_timeout=15))
    serve_solos(h1, h2, cfg)
    subprocess.run(["ip", "-n", ns(h2), "route", "add", "blackhole", f"{h1.address}/32"], check=True)
    since = time.time()
    result = operations(settings.load(cfg)).switch("rayed")
    assert result["outcome"] == "rolled_back", result
    assert "Ray cluster of rayed" in result["error"] and "shows 1 of 2 nodes" in result["error"], result["error"]
    assert "ray_join_timeout_s = 15" in result["error"] and "1 GPU, 1 CPU" in result["error"]
    assert "Failed to connect to GCS" in result["error"]  # the worker's journal, from h2
    assert started_since(h2, "ray-rayed-worker.service", since)
    assert not started_since(h1, "vllm-rayed.service", since)
    assert completes(h1, 8301, "solo1") and completes(h2, 8302, "solo2")
    assert [state(h, u) for h, u in ((h1, "ray-rayed-head.service"), (h2, "ray-rayed-worker.service"))] == [
        "inactive",
        "inactive",
    ]
    assert (ray_processes(h1), ray_processes(h2)) == ("", "")


def test_ray_model_stops_cleanly_when_a_single_box_model_replaces_it(hosts: list[Host], tmp_path: Path) -> None:
    """rayed -> solo1: the engine, head and worker units end inactive (not failed) and leave no Ray process."""
    h1, h2 = hosts
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state"))
    ops = operations(settings.load(cfg))
    assert ops.switch("rayed")["outcome"] == "active"
    assert ray_processes(h2) != ""
    assert ops.switch("solo1")["outcome"] == "active"
    assert [
        state(h, u)
        for h, u in ((h1, "vllm-rayed.service"), (h1, "ray-rayed-head.service"), (h2, "ray-rayed-worker.service"))
    ] == ["inactive"] * 3
    assert (ray_processes(h1), ray_processes(h2)) == ("", "")
    assert completes(h1, 8301, "solo1")


def test_engine_whose_placement_group_cannot_be_placed_fails_loudly_and_rolls_back(
    hosts: list[Host], tmp_path: Path
) -> None:
    """The engine wants 3 GPU bundles of a 2-GPU cluster: it exits naming the placement group; solo1 serves again."""
    h1, h2 = hosts
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(h1, h2, tmp_path / "state"))
    ops = operations(settings.load(cfg))
    assert ops.switch("solo1")["outcome"] == "active"
    result = ops.switch("rayed-too-wide")
    assert result["outcome"] == "rolled_back", result
    assert "Ray executor failed: placement group of 3 x {GPU: 1} (PACK" in result["error"], result["error"]
    assert "not placed within 5 s" in result["error"] and "2 node(s) alive" in result["error"]
    assert completes(h1, 8301, "solo1")
    assert (ray_processes(h1), ray_processes(h2)) == ("", "")
