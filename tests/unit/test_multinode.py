"""Models larger than one box: deploy.toml validation, the planner across nodes, rendered units per
role, and the switch across fake hosts (start order, rollback on every node, health per node)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import planner
from orchestrator.core.catalog import Catalog
from orchestrator.core.multinode import render_nodes
from orchestrator.core.states import Phase
from orchestrator.deploy import multinode
from orchestrator.deploy.deployer import Deployer
from orchestrator.resources import template_text
from orchestrator.testing import FakeClock, FakeHost, FakeStateStore, FakeWeights

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
KIMI = REPO / "tests/fixtures/configs/moonshotai__Kimi-K2.5.json"
HOSTS = """
[hosts.g1]
address = "10.0.0.1"
gpus = 8
interface = "eth1"
network = "ethernet"
[hosts.g2]
address = "10.0.0.2"
gpus = 8
"""


def toml(model: str, gpus: str = "[0, 1, 2, 3, 4, 5, 6, 7]") -> str:
    return HOSTS + f'[models.big]\nrepo = "org/big"\ngpus = {gpus}\n' + model


def orchestrator(*args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, cwd=REPO)


@pytest.mark.parametrize(
    "model,key,message",
    [
        (
            'nodes = ["g1", "g1"]\ntensor_parallel = 8\npipeline_parallel = 2\n',
            "models.big.nodes",
            "host 'g1' is listed twice",
        ),
        ('nodes = ["g1", "g9"]\ntensor_parallel = 8\npipeline_parallel = 2\n', "models.big.nodes", "unknown host 'g9'"),
        ('nodes = ["g1", "g2"]\ntensor_parallel = 4\n', "models.big", "2 nodes x 8 GPUs each"),
        (f'nodes = ["g1", "g2"]\ntensor_parallel = 8\npipeline_parallel = 2\nconfig = "{KIMI}"\n', None, None),
    ],
)
def test_bad_node_layouts_exit_2_naming_the_key(
    tmp_path: Path, model: str, key: str | None, message: str | None
) -> None:
    """A node listed twice, an unknown node, a GPU count that does not add up: exit 2 with the key; a good one loads."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(toml(model))
    r = orchestrator("models", "--config", str(cfg))
    if key is None:
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert key in r.stderr and message is not None and message in r.stderr, r.stderr


def test_tp_larger_than_a_nodes_gpus_exits_2(tmp_path: Path) -> None:
    """tensor_parallel 16 over two 8-GPU boxes is refused by name: TP stays inside a box."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        HOSTS + '[models.big]\nrepo = "org/big"\nnodes = ["g1", "g2"]\ngpus = [0, 1, 2, 3, 4, 5, 6, 7]\n'
        "tensor_parallel = 16\n"
    )
    r = orchestrator("models", "--config", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "models.big.tensor_parallel" in r.stderr and "larger than node g1's 8 GPUs" in r.stderr


def test_pp_larger_than_the_layers_exits_2(tmp_path: Path) -> None:
    """PP 64 over 61 layers (Kimi's config.json) is refused, naming pipeline_parallel and the layer count."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        HOSTS.replace("gpus = 8", "gpus = 64") + '[models.big]\nrepo = "org/big"\nnodes = ["g1", "g2"]\n'
        f"gpus = [{', '.join(map(str, range(32)))}]\ntensor_parallel = 1\npipeline_parallel = 64\n"
        f'config = "{KIMI}"\n'
    )
    r = orchestrator("models", "--config", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "models.big.pipeline_parallel" in r.stderr and "61 layers" in r.stderr, r.stderr


def test_kimi_does_not_fit_one_box_but_fits_two_with_pp() -> None:
    """On one 8 x 96 GiB box TP=8 cannot load; on 2 nodes TP=8 + PP=2 is valid, TP inside a box."""
    cfg = json.loads(KIMI.read_text())
    one = planner.plan(cfg, planner.Layout(8), planner.Hardware(8, 96.0))
    two = planner.plan(cfg, planner.Layout(8, 2), planner.Hardware(8, 96.0, nodes=2))
    assert not one.valid and two.valid
    assert two.requested.memory is not None and two.requested.memory.required_gib < 86.4


def test_tp_across_boxes_warns_with_the_network() -> None:
    """TP 16 over 2 nodes of 8 loads but warns that every all-reduce crosses the (ethernet) network."""
    cfg = json.loads(KIMI.read_text())
    v = planner.plan(cfg, planner.Layout(16), planner.Hardware(8, 96.0, nodes=2, network="ethernet")).requested
    assert any("TP 16 crosses boxes" in w and "ethernet" in w for w in v.warnings), v.warnings


def test_tp_that_straddles_nodes_is_invalid() -> None:
    """TP 3 on nodes of 8 GPUs cannot split evenly inside a node: refused with the numbers."""
    cfg = json.loads(KIMI.read_text())
    v = planner.plan(cfg, planner.Layout(3, 1, 2), planner.Hardware(8, 96.0, nodes=2)).requested
    assert not v.valid and any("do not split evenly over 2 nodes" in r or "does not divide" in r for r in v.reasons)


def test_plan_cli_bare_config_with_nodes() -> None:
    """`plan --config kimi.json --gpus 8 --nodes 2 --tp 8 --pp 2` is valid (exit 0), the same TP=8 alone is not."""
    args = ["plan", "--config", str(KIMI), "--gpus", "8", "--gpu-memory-gib", "96", "--tp", "8", "--json"]
    two = orchestrator(*args, "--nodes", "2", "--pp", "2")
    one = orchestrator(*args)
    assert two.returncode == 0 and json.loads(two.stdout)["valid"] is True
    assert one.returncode == 3


def catalog(backend: str = "native", **model: Any) -> Catalog:
    return Catalog.model_validate(
        {
            "defaults": {
                "engine": ["/opt/vllm/bin/vllm", "serve"],
                "free_timeout_s": 5,
                "load_deadline_s": 30,
                "health_interval_s": 0.1,
            },
            "hosts": {
                "g1": {"address": "10.0.0.1", "gpus": 2, "interface": "eth1"},
                "g2": {"address": "10.0.0.2", "gpus": 2},
            },
            "models": {
                "big": {
                    "repo": "org/big",
                    "nodes": ["g1", "g2"],
                    "gpus": [0, 1],
                    "tensor_parallel": 2,
                    "pipeline_parallel": 2,
                    "port": 8000,
                    "backend": backend,
                    **model,
                },
                "small1": {"repo": "org/s", "host": "g1", "gpus": [0, 1], "tensor_parallel": 2, "port": 8001},
                "small2": {"repo": "org/s", "host": "g2", "gpus": [0, 1], "tensor_parallel": 2, "port": 8002},
            },
        }
    )


def test_native_units_rank0_serves_and_rank1_is_headless() -> None:
    """Native: rank 0 has --nnodes/--node-rank 0/--master-addr of g1; rank 1 on g2 adds --headless and its own IP."""
    cat = catalog()
    r = render_nodes(cat, cat.models["big"], template_text)
    assert '"--nnodes" "2" "--node-rank" "0" "--master-addr" "10.0.0.1" "--master-port" "29500"' in r.api.text
    assert '"--headless"' not in r.api.text and '"VLLM_HOST_IP=10.0.0.1"' in r.api.text
    assert '"GLOO_SOCKET_IFNAME=eth1"' in r.api.text and '"NCCL_SOCKET_IFNAME=eth1"' in r.api.text
    [node] = r.nodes
    assert (node.host, node.role, node.unit_name) == ("g2", "headless", "vllm-big-node1.service")
    assert '"--node-rank" "1" "--master-addr" "10.0.0.1" "--master-port" "29500" "--headless"' in node.unit_text
    assert '"VLLM_HOST_IP=10.0.0.2"' in node.unit_text


def test_ray_units_head_workers_and_engine() -> None:
    """Ray: a head on g1, a worker on g2 joining it with --block and its GPU count, the engine with the ray backend."""
    cat = catalog("ray")
    r = render_nodes(cat, cat.models["big"], template_text)
    head, worker = r.nodes
    assert (head.host, head.role, worker.host, worker.role) == ("g1", "ray-head", "g2", "ray-worker")
    assert '"start" "--head" "--port" "6379"' in head.unit_text and '"--block"' in head.unit_text
    assert '"--address" "10.0.0.1:6379" "--block" "--node-ip-address" "10.0.0.2" "--num-gpus" "2"' in worker.unit_text
    assert '"--distributed-executor-backend" "ray"' in r.api.text and '"RAY_ADDRESS=10.0.0.1:6379"' in r.api.text


@pytest.mark.parametrize("backend", ["native", "ray"])
def test_node_address_is_where_the_nodes_reach_each_other_not_address(backend: str) -> None:
    """hosts.NAME.node_address set: the units name it (master/Ray address, VLLM_HOST_IP, --node-ip-address)
    and never the host's address, which stays the orchestrator's way in over SSH."""
    raw = catalog(backend).model_dump(mode="json", exclude_unset=True)
    raw["hosts"]["g1"]["node_address"], raw["hosts"]["g2"]["node_address"] = "192.168.100.1", "192.168.100.2"
    cat = Catalog.model_validate(raw)
    r = render_nodes(cat, cat.models["big"], template_text)
    texts = [r.api.text, *(n.unit_text for n in r.nodes)]
    assert not any("10.0.0." in t for t in texts)
    if backend == "native":
        assert '"--master-addr" "192.168.100.1"' in r.api.text
        assert '"VLLM_HOST_IP=192.168.100.2"' in r.nodes[0].unit_text
    else:
        assert '"--address" "192.168.100.1:6379" "--block" "--node-ip-address" "192.168.100.2"' in r.nodes[1].unit_text


def test_ray_units_keep_ray_files_in_the_state_directory_and_take_ray_args() -> None:
    """Both Ray units: --temp-dir /var/lib/ray, no drain, short stop, ray_args last;
    only the head turns the dashboard off."""
    cat = catalog("ray", ray_args=["--num-cpus", "1"])
    head, worker = render_nodes(cat, cat.models["big"], template_text).nodes
    for unit in (head.unit_text, worker.unit_text):
        assert '"--temp-dir" "/var/lib/ray" "--disable-usage-stats"' in unit and "StateDirectory=ray\n" in unit
        assert '"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0"' in unit and "TimeoutStopSec=15\n" in unit
        assert "SuccessExitStatus=1\n" in unit
    assert '"--include-dashboard" "false" "--num-cpus" "1"\n' in head.unit_text
    assert "--include-dashboard" not in worker.unit_text
    assert '"--disable-usage-stats" "--num-cpus" "1"\n' in worker.unit_text


RAY_FIXTURES = REPO / "tests/fixtures/ray"


@pytest.mark.parametrize(
    "fixture,nodes",
    [
        ("status-v-head-only.txt", [("cb080578", {"CPU": 1.0, "GPU": 2.0})]),
        ("status-v-2-nodes.txt", [("c54cf3d8", {"CPU": 1.0, "GPU": 1.0}), ("366f4922", {"CPU": 1.0, "GPU": 1.0})]),
        (
            "status-v-2-nodes-serving.txt",
            [("7d95939f", {"CPU": 1.0, "GPU": 1.0}), ("ce69c2d5", {"CPU": 1.0, "GPU": 1.0})],
        ),
    ],
)
def test_ray_status_nodes_reads_every_node_with_its_cpus_and_gpus(fixture: str, nodes: list[Any]) -> None:
    """Real `ray status -v` of Ray 2.60 (head only, two nodes, two nodes with a placement group): each node's totals."""
    found = multinode.ray_status_nodes((RAY_FIXTURES / fixture).read_text())
    assert [(n.node_id[:8], {k: v for k, v in n.totals.items() if k in ("CPU", "GPU")}) for n in found] == nodes


def test_ray_status_nodes_of_a_failed_status_is_empty() -> None:
    """`ray status` that could not reach the GCS prints no node block: no node is counted."""
    assert multinode.ray_status_nodes("ray.exceptions.RpcError: Timed out while waiting for GCS") == []


class Fleet:
    """Two fake hosts sharing one clock and one store, and an engine over both."""

    def __init__(self, cat: Catalog) -> None:
        clock = FakeClock()
        self.hosts = {n: FakeHost(name=n, gpu_count=2, clock=clock) for n in ("g1", "g2")}
        self.store = FakeStateStore()
        ports = {n: h.ports(cat.hosts[n]) for n, h in self.hosts.items()}
        self.engine = Deployer(cat, self.store, lambda n: ports[n])

    def switch(self, model: str) -> Any:
        dep = self.engine.plan_switch(model)
        assert dep is not None
        return self.engine.run(dep.id)


def test_switch_starts_headless_ranks_before_rank0_and_stops_peers_models() -> None:
    """small2 serves on g2; switching to big stops it, starts g2's headless rank, then rank 0 on g1."""
    fleet = Fleet(catalog())
    fleet.switch("small2")
    dep = fleet.switch("big")
    assert dep.phase is Phase.ACTIVE, dep.error
    assert fleet.hosts["g2"].active_units() == ["vllm-big-node1.service"]
    assert fleet.hosts["g1"].active_units() == ["vllm-big.service"]
    assert (
        fleet.hosts["g2"].units["vllm-big-node1.service"].started_at
        <= fleet.hosts["g1"].units["vllm-big.service"].started_at
    )
    assert "stop vllm-small2.service" in fleet.hosts["g2"].calls
    assert fleet.store.serving("g2") is None


def test_failure_on_rank0_rolls_back_every_node() -> None:
    """big answers /health but no completion: both nodes stop, small1 comes back on g1 and small2 on g2."""
    fleet = Fleet(catalog())
    fleet.switch("small2")
    fleet.switch("small1")
    fleet.hosts["g1"].behaviours["vllm-big.service"] = "health_only"
    dep = fleet.switch("big")
    assert dep.phase is Phase.ROLLED_BACK
    assert "completions failed" in (dep.error or "")
    assert fleet.hosts["g1"].active_units() == ["vllm-small1.service"]
    assert fleet.hosts["g2"].active_units() == ["vllm-small2.service"]


def test_a_lost_node_makes_the_model_unhealthy() -> None:
    """With rank 1 stopped on g2 the API unit still runs, but the model is not healthy."""
    fleet = Fleet(catalog())
    dep = fleet.switch("big")
    assert fleet.engine.is_healthy(dep)
    fleet.hosts["g2"].units["vllm-big-node1.service"].active = "failed"
    assert not fleet.engine.is_healthy(dep)


def test_switch_from_multinode_to_single_box_and_back() -> None:
    """big -> small1 stops big on both nodes; small1 -> big brings both ranks back."""
    fleet = Fleet(catalog())
    fleet.switch("big")
    assert fleet.switch("small1").phase is Phase.ACTIVE
    assert fleet.hosts["g2"].active_units() == [] and fleet.hosts["g1"].active_units() == ["vllm-small1.service"]
    assert fleet.switch("big").phase is Phase.ACTIVE
    assert fleet.hosts["g2"].active_units() == ["vllm-big-node1.service"]
    assert fleet.hosts["g1"].active_units() == ["vllm-big.service"]


def test_a_multinode_switch_reloads_each_nodes_systemd_once() -> None:
    """Units unchanged: a peer node disabling its own model and enabling its rank shares one daemon-reload."""
    fleet = Fleet(catalog())
    for model in ("small2", "big", "small1", "small2"):
        fleet.switch(model)
    before = len(fleet.hosts["g2"].calls)
    assert fleet.switch("big").phase is Phase.ACTIVE
    assert fleet.hosts["g2"].calls[before:].count("daemon-reload") == 1
    assert fleet.hosts["g2"].units["vllm-big-node1.service"].enabled
    assert not fleet.hosts["g2"].units["vllm-small2.service"].enabled


def test_render_writes_every_role(tmp_path: Path) -> None:
    """`orchestrator render` writes rank 0 and the headless rank of a native model, each with its node's IP."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(toml('nodes = ["g1", "g2"]\ntensor_parallel = 8\npipeline_parallel = 2\n'))
    r = orchestrator("render", "--config", str(cfg), "--out", str(tmp_path / "units"))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == ["vllm-big-node1.service", "vllm-big.service"]
    assert '"VLLM_HOST_IP=10.0.0.2"' in (tmp_path / "units/vllm-big-node1.service").read_text()


def two_big(**big2: Any) -> Catalog:
    """big as before, and big2: another native model over both nodes on the same GPUs."""
    data = catalog().model_dump()
    data["models"]["big2"] = {**data["models"]["big"], "port": 8003, "master_port": 29501, **big2}
    return Catalog.model_validate(data)


class Crash(Exception):
    """The agent dying in the middle of a step (not an OrchestratorError: nothing handles it)."""


def crash_at(event: str, node: str, unit: str | None = None) -> Any:
    def progress(name: str, fields: dict[str, Any]) -> None:
        if name == event and fields.get("node") == node and unit in (None, fields.get("unit")):
            raise Crash(f"{event} on {node}")

    return progress


def test_per_node_progress_is_recorded_and_a_crash_after_the_headless_rank_resumes() -> None:
    """Killed once g2's rank is started (rank 0 not): the record says so per node; the re-run starts
    rank 0 only, leaving g2's running rank alone, and ends active."""
    fleet = Fleet(catalog())
    fleet.switch("small1")
    fleet.engine.progress = crash_at("node_started", "g2")
    dep = fleet.engine.plan_switch("big")
    assert dep is not None
    with pytest.raises(Crash):
        fleet.engine.run(dep.id)
    assert fleet.store.get(dep.id).phase is Phase.STARTING
    assert [(e["step"], e["node"]) for e in fleet.engine.node_progress(dep) if e["phase"] == "starting"] == [
        ("started", "g2")
    ]
    fleet.engine.progress = lambda event, fields: None
    assert fleet.engine.run(dep.id).phase is Phase.ACTIVE
    assert fleet.hosts["g2"].calls.count("start vllm-big-node1.service") == 1
    assert [(e["phase"], e["step"], e["node"]) for e in fleet.engine.node_progress(dep)] == [
        ("installing", "installed", "g2"),
        ("installing", "installed", "g1"),
        ("starting", "started", "g2"),
        ("starting", "started", "g1"),
        ("checking", "ready", "g2"),
        ("checking", "ready", "g1"),
    ]


def test_a_crash_during_rollback_resumes_without_restarting_what_it_brought_back() -> None:
    """big2 fails on g1 and rolls back to big; killed once big's rank is back on g2, the resumed
    rollback neither stops nor restarts it, and big serves on both nodes."""
    fleet = Fleet(two_big())
    fleet.switch("big")
    fleet.hosts["g1"].behaviours["vllm-big2.service"] = "health_only"
    fleet.engine.progress = crash_at("node_started", "g2", "vllm-big-node1.service")
    dep = fleet.engine.plan_switch("big2")
    assert dep is not None
    with pytest.raises(Crash):
        fleet.engine.run(dep.id)
    assert fleet.store.get(dep.id).phase is Phase.ROLLING_BACK
    fleet.engine.progress = lambda event, fields: None
    assert fleet.engine.run(dep.id).phase is Phase.ROLLED_BACK
    assert fleet.hosts["g2"].calls.count("start vllm-big-node1.service") == 2  # the first switch, the rollback
    assert fleet.hosts["g2"].calls.count("stop vllm-big-node1.service") == 1  # by big2's stopping only
    assert fleet.hosts["g2"].active_units() == ["vllm-big-node1.service"]
    assert fleet.hosts["g1"].active_units() == ["vllm-big.service"]


def test_a_rank_systemd_restarted_on_its_own_makes_the_model_unhealthy() -> None:
    """g2's rank died and systemd restarted it (active again, NRestarts 1): the model is not healthy."""
    fleet = Fleet(catalog())
    dep = fleet.switch("big")
    fleet.hosts["g2"].units["vllm-big-node1.service"].restarts = 1
    assert not fleet.engine.is_healthy(dep)


def test_single_box_switch_on_a_rank_node_is_refused_naming_the_multinode_model() -> None:
    """small2 on g2's GPUs while big's rank 1 runs there: Busy-class refusal naming big, its head and
    the stop command; nothing recorded, nothing stopped."""
    from orchestrator.errors import NodeInUse

    fleet = Fleet(catalog())
    fleet.switch("big")
    with pytest.raises(
        NodeInUse,
        match=r"vllm-big-node1.service runs a rank of multi-node model big "
        r"\(headed on g1\).*`orchestrator stop big`",
    ) as info:
        fleet.engine.plan_switch("small2")
    assert info.value.exit_code == 5
    assert len(fleet.store.history()) == 1
    assert fleet.hosts["g2"].active_units() == ["vllm-big-node1.service"]


def test_stop_of_a_multinode_model_stops_every_node(tmp_path: Path) -> None:
    """`stop big` (the command the refusal names) stops rank 0 on g1 and the headless rank on g2."""
    from orchestrator.deploy.operations import Operations

    cat = catalog().model_copy(update={"state_dir": str(tmp_path)})
    clock = FakeClock()
    hosts = {n: FakeHost(name=n, gpu_count=2, clock=clock) for n in ("g1", "g2")}
    ports = {n: h.ports(cat.hosts[n]) for n, h in hosts.items()}
    ops = Operations(cat, lambda n: ports[n], store=FakeStateStore())
    assert ops.switch("big")["outcome"] == "active"
    assert ops.stop("big")["outcome"] == "stopped"
    assert hosts["g1"].active_units() == [] and hosts["g2"].active_units() == []
    assert not hosts["g2"].units["vllm-big-node1.service"].enabled


class RootedWeights(FakeWeights):
    """Stages into its own host's models_dir, as the real store does, whatever the spec says."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def stage(self, spec: Any, progress: Any) -> Any:
        from orchestrator.ports import StagedWeights

        self.staged.append(spec.model_dir)
        return StagedWeights(
            path=f"{self.root}/{spec.repo.replace('/', '--')}/{spec.revision}", revision=spec.revision, total_bytes=0
        )


def test_each_node_stages_into_and_runs_from_its_own_models_dir() -> None:
    """g2 keeps weights under /data/models: its rank's unit reads them there, rank 0 under g1's /models."""
    data = catalog().model_dump()
    data["hosts"]["g2"]["models_dir"] = "/data/models"
    data["models"]["big"].update(source="hub", revision="a" * 40)
    cat = Catalog.model_validate(data)
    rendered = render_nodes(
        cat, cat.models["big"], template_text, model_dir=f"/models/org--big/{'b' * 40}", revision="b" * 40
    )
    assert f'"--model" "/models/org--big/{"b" * 40}"' in rendered.api.text
    assert f'"--model" "/data/models/org--big/{"b" * 40}"' in rendered.nodes[0].unit_text
    clock = FakeClock()
    hosts = {n: FakeHost(name=n, gpu_count=2, clock=clock) for n in ("g1", "g2")}
    weights = {"g1": RootedWeights("/models"), "g2": RootedWeights("/data/models")}
    ports = {n: h.ports(cat.hosts[n], weights=weights[n]) for n, h in hosts.items()}
    engine = Deployer(cat, FakeStateStore(), lambda n: ports[n])
    dep = engine.plan_switch("big")
    assert dep is not None
    assert engine.run(dep.id).phase is Phase.ACTIVE, engine.store.get(dep.id).error
    assert weights["g2"].staged == [f"/data/models/org--big/{'a' * 40}"]
    assert f'"--model" "/data/models/org--big/{"a" * 40}"' in hosts["g2"].units["vllm-big-node1.service"].text
