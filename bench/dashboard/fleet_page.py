#!/usr/bin/env python3
"""What a controller's fleet page costs: the real controller, fleet and dashboard code in this process,
against simulated box agents (rollout/simulated.py: the agent's wire protocol over socket pairs, with a
fake network round trip), so what is measured is the page's own fan-out and render.

- page: GET /fleet on the dashboard's Unix socket with the boxes asked every time (refresh_s below the
  gap between reads), N times, for a group of B boxes at a round trip of R ms;
- follow: a rollout started with the page open: from the start to the first SSE message showing the
  canary switching, and to the one showing the rollout succeeded.

Writes the raw lines to bench/dashboard/fleet_page.txt.

    .venv/bin/python bench/dashboard/fleet_page.py [--n 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.agent.controller import FleetController
from orchestrator.agent.daemon import Agent
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.dashboard.service import start
from orchestrator.deploy.operations import Operations
from orchestrator.rollout.simulated import SimulatedBox
from orchestrator.testing import FakeClock, FakeRolloutStore, FakeStateStore
from tests.builders.unix_http import UnixHTTP, sse_marks
from tests.unit.conftest import make_catalog

OUT = Path(__file__).with_name("fleet_page.txt")


def controller(tmp: Path, boxes: int, rtt_ms: float) -> tuple[Agent, Any, str]:
    names = [f"b{i:04d}" for i in range(boxes)]
    hosts = {h: {"transport": "ssh", "address": "127.0.0.9", "gpus": 8, "gpu_memory_gib": 96} for h in names}
    path = str(tmp / "d.sock")
    catalog = make_catalog(
        state_dir=str(tmp / "state"),
        hosts=hosts,
        dashboard={"socket": path, "refresh_s": 0.2},
        groups={"inference": {"hosts": names, "canary": 1, "batch": max(1, boxes // 4)}},
        models={
            "beta": {
                "repo": "org/beta",
                "group": "inference",
                "gpus": [0, 1, 2, 3],
                "tensor_parallel": 4,
                "port": 8001,
                "source": "none",
            }
        },
    )
    sims = {
        h: SimulatedBox(h, {"alpha": "org/alpha", "beta": "org/beta"}, serving="alpha", delay_s=rtt_ms / 2000)
        for h in names
    }
    ops = Operations(catalog, lambda name: (_ for _ in ()).throw(AssertionError(name)), store=FakeStateStore())
    agent = Agent(catalog, ops, socket=str(tmp / "agent.sock"), metrics_port=None, clock=FakeClock())
    agent.controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=lambda host: sims[host.name]
    )
    server = start(agent)
    assert server is not None
    return agent, server, path


def pages(path: str, n: int) -> list[float]:
    conn = UnixHTTP(path, timeout=120)
    out = []
    for _ in range(n):
        time.sleep(0.25)  # past refresh_s: every read asks the boxes again
        t0 = time.perf_counter()
        conn.request("GET", "/fleet")
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200 and b'class="boxes"' in body, resp.status
        out.append((time.perf_counter() - t0) * 1000)
    conn.close()
    return out


def follow(agent: Agent, path: str) -> tuple[float, float]:
    """(ms to the first message showing the canary batch switching, ms to the one showing the rollout done)."""
    return sse_marks(
        path,
        "/fleet/events",
        lambda: agent.controller.start(RolloutStartArgs(model="beta"), "bench"),
        lambda html: 'data-batch="0" data-state="switching"' in html["g0-rollout"],
        lambda html: 'data-status="succeeded"' in html["g0-rollout"],
    )


def summary(name: str, values: list[float]) -> str:
    q = statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    return (
        f"{name:<40} n={len(values):<3} median {statistics.median(values):8.1f} ms  p90 {q:8.1f} ms  "
        f"max {max(values):8.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    head = (
        f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, controller in-process, simulated boxes "
        f"(socket pairs, fake round trip), python {sys.version.split()[0]}"
    )
    lines = [head]
    for boxes, rtt in ((4, 0.0), (4, 20.0), (100, 0.0), (100, 20.0), (1000, 0.0)):
        with tempfile.TemporaryDirectory(prefix="fleet-page-", dir="/tmp") as tmp:
            agent, server, path = controller(Path(tmp), boxes, rtt)
            try:
                lines.append(summary(f"GET /fleet, {boxes} boxes, rtt {rtt:g} ms", pages(path, args.n)))
                if boxes <= 100:
                    canary, done = follow(agent, path)
                    lines.append(
                        f"rollout over {boxes} boxes, rtt {rtt:g} ms: canary shown switching after "
                        f"{canary:.1f} ms, succeeded shown after {done:.1f} ms"
                    )
            finally:
                server.close()
        print(lines[-1], flush=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
