"""The stand-in's Ray executor: what vLLM's Ray executor does before it serves, in small.

vLLM with ``--distributed-executor-backend ray`` connects to the cluster at RAY_ADDRESS, reserves a
placement group of TP x PP bundles of one GPU each (strategy PACK, the first bundle pinned to the
driver's node), starts one worker actor per bundle, and only then opens its API
(vllm/v1/executor/ray_utils.py ``initialize_ray_cluster``, ray_executor.py). This does the same with
actors that only report where they run. Needs ``ray`` importable (the engine's venv); imported by
openai_server.py only when it is given ``--ray-address``.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


class PlacementError(RuntimeError):
    """The placement group could not be placed within the timeout."""


@ray.remote(num_cpus=0, num_gpus=1)
class Worker:
    """One rank: reports the node and the GPU Ray gave it."""

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        }


def place(address: str, world: int, driver_ip: str, timeout: float) -> list[dict[str, Any]]:
    """Join the cluster, place ``world`` GPU bundles and one worker on each: where each rank runs."""
    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    bundles: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(world)]
    bundles[0][f"node:{driver_ip}"] = 0.001  # like vLLM: rank 0 on the driver's node
    pg = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        state = placement_group_table(pg).get("state", "unknown")
        raise PlacementError(
            f"placement group of {world} x {{GPU: 1}} (PACK, rank 0 on {driver_ip}) not placed within "
            f"{timeout:g} s (state {state}); the cluster has {ray.cluster_resources()} with "
            f"{len([n for n in ray.nodes() if n['Alive']])} node(s) alive"
        )
    workers = [
        Worker.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i)
        ).remote()
        for i in range(world)
    ]
    placed: list[dict[str, Any]] = ray.get([w.where.remote() for w in workers], timeout=timeout)
    for rank, info in enumerate(placed):
        info["rank"] = rank
    # Keep the actors alive while serving, as vLLM's workers are: they go with this driver.
    _KEEP.extend(workers)
    return placed


_KEEP: list[Any] = []
