"""Project a controller's rollout over 100 and 1,000 boxes: the real controller code (the agent's
FleetController, rollout/fleet.py, the fan-out, rollouts.db in SQLite) against in-process simulated
box agents (rollout/simulated.py: the agent's wire protocol over socket pairs, a fake network round
trip per channel open and per request, a switch that takes a fixed time).

    .venv/bin/python bench/fleet/fleet_sim.py [--switch-s 1.0] [--rtt-s 0.02] [--case BOXES:BATCH ...]

Prints, per case: wall time of the preflight and of each batch (and its overhead over the switch
itself), the process's CPU seconds (controller and simulated boxes together: the boxes only sleep
and answer), peak RSS, peak channels open at once and peak threads.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.adapters.clock import SystemClock
from orchestrator.agent.controller import FleetController
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.core.catalog import Catalog
from orchestrator.rollout.simulated import SimulatedBox
from orchestrator.rollout.store import RolloutStore


def catalog(n: int, batch: int, state_dir: str) -> Catalog:
    hosts = {
        f"b{i}": {"transport": "ssh", "address": f"127.0.{i // 250}.{i % 250 + 1}", "gpus": 8, "gpu_memory_gib": 96}
        for i in range(n)
    }
    return Catalog.model_validate(
        {
            "state_dir": state_dir,
            "defaults": {"engine": ["/opt/vllm/bin/vllm", "serve"]},
            "hosts": hosts,
            "groups": {"fleet": {"hosts": list(hosts), "canary": 1, "batch": batch, "gate": "health"}},
            "models": {
                "beta": {
                    "repo": "org/beta",
                    "group": "fleet",
                    "gpus": [0, 1, 2, 3],
                    "tensor_parallel": 4,
                    "port": 8001,
                    "source": "none",
                }
            },
        }
    )


class Peaks:
    def __init__(self, boxes: list[SimulatedBox]) -> None:
        self.boxes, self.channels, self.threads = boxes, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(0.01):
            self.channels = max(self.channels, sum(b.open_channels for b in self.boxes))
            self.threads = max(self.threads, threading.active_count())


def run_case(n: int, batch: int, switch_s: float, rtt_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-sim-") as tmp:
        cat = catalog(n, batch, tmp)
        boxes = {
            name: SimulatedBox(
                name, {"beta": "org/beta", "alpha": "org/alpha"}, serving="alpha", switch_s=switch_s, delay_s=rtt_s
            )
            for name in cat.hosts
        }
        marks: list[float] = []
        store = RolloutStore(Path(tmp) / "rollouts.db", group=None)
        ctl = FleetController(
            lambda: cat,
            clock=SystemClock(),
            pid=1,
            store=store,
            connect=lambda host: boxes[host.name],
            after_batch=lambda b: marks.append(time.time()),
        )
        peaks = Peaks(list(boxes.values()))
        cpu0, t0 = time.process_time(), time.time()
        rid = ctl.start(RolloutStartArgs(model="beta"), "bench")["id"]
        summary = list(ctl.follow(rid))[-1]["result"]
        t1, cpu1 = time.time(), time.process_time()
        peaks.stop.set()
        peaks.thread.join()
        times = store.host_times(rid)
        first_switch = min(s for s, _ in times.values() if s is not None)
        batches = [b - a for a, b in zip([first_switch, *marks[:-1]], marks, strict=True)]
        assert summary["rollout"]["status"] == "succeeded", summary["rollout"]
        assert all(b.switches("beta") == 1 for b in boxes.values())
        return {
            "boxes": n,
            "batch": batch,
            "batches": len(batches),
            "preflight_s": first_switch - t0,
            "wall_s": t1 - t0,
            "batch_s": batches,
            "cpu_s": cpu1 - cpu0,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak_channels": peaks.channels,
            "peak_threads": peaks.threads,
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--switch-s", type=float, default=1.0, help="one box's switch (the engine's load)")
    ap.add_argument("--rtt-s", type=float, default=0.02, help="one network round trip")
    ap.add_argument("--case", action="append", default=None, help="BOXES:BATCH (repeatable)")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a batch of N holds N channels (2 fds each here)
    print(f"switch_s={a.switch_s} rtt_s={a.rtt_s} nofile={hard} (was {soft})")
    for case in a.case or ["100:10", "100:100", "1000:100", "1000:1000"]:
        n, batch = (int(x) for x in case.split(":"))
        r = run_case(n, batch, a.switch_s, a.rtt_s)
        later = r["batch_s"][1:] or r["batch_s"]
        print(
            f"boxes={r['boxes']} batch={r['batch']} batches={r['batches']} wall_s={r['wall_s']:.2f} "
            f"preflight_s={r['preflight_s']:.2f} canary_s={r['batch_s'][0]:.2f} "
            f"batch_s_median={statistics.median(later):.2f} batch_s_max={max(later):.2f} "
            f"overhead_per_batch_s={statistics.median(later) - a.switch_s:.2f} cpu_s={r['cpu_s']:.2f} "
            f"peak_rss_mib={r['rss_mib']:.0f} peak_channels={r['peak_channels']} "
            f"peak_threads={r['peak_threads']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
