#!/usr/bin/env python3
"""What the dashboard costs and how fast it follows: the agent in this process over the fake ports
(orchestrator/testing.py: no SSH, no GPUs; what is measured is the dashboard's own work).

- page: GET / on the dashboard's Unix socket (status + history + GPU snapshot + render), N times;
- forwarded: the same through `orchestrator dashboard`'s Forwarder on 127.0.0.1 (token cookie);
- follow: a switch submitted to the agent (a job, as the CLI submits it): from its submission to the
  first SSE message whose models section shows the new model serving, and to the first that shows
  the switch running at all.

Writes the raw lines to bench/dashboard/dashboard_latency.txt.

    .venv/bin/python bench/dashboard/dashboard_latency.py [--n 40] [--switches 10]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from orchestrator.agent.daemon import Agent
from orchestrator.client.forward import Forwarder, unix_opener
from orchestrator.dashboard.service import start
from tests.builders.unix_http import UnixHTTP, sse_marks
from tests.unit.conftest import OpsWorld

OUT = Path(__file__).with_name("dashboard_latency.txt")


def timed_gets(conn: http.client.HTTPConnection, n: int, headers: dict[str, str]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/", headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200 and b'class="gpus"' in body, resp.status
        out.append((time.perf_counter() - t0) * 1000)
    return out


def follow(agent: Agent, path: str, model: str) -> tuple[float, float]:
    """(ms to the first message showing the switch running, ms to the one showing MODEL serving)."""
    return sse_marks(
        path,
        "/events",
        lambda: threading.Thread(
            target=lambda: list(agent.dispatch("switch", {"model": model}, "bench")), daemon=True
        ).start(),
        lambda html: 'data-state="running"' in html["h0-operation"],
        lambda html: f'data-model="{model}" data-state="serving"' in html["h0-models"],
    )


def summary(name: str, values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    return (
        f"{name:<28} n={len(values):<3} median {statistics.median(values):7.1f} ms  p90 {q[8]:7.1f} ms  "
        f"max {max(values):7.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--switches", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    sock = str(root / "dash.sock")
    world = OpsWorld(root / "state", dashboard={"socket": sock, "refresh_s": 2.0})
    agent = Agent(world.catalog, world.ops, socket=str(root / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    fwd = Forwarder(unix_opener(sock))
    threading.Thread(target=fwd.serve_forever, daemon=True).start()
    lines = [
        (
            f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, agent in-process over fake ports, "
            f"refresh_s 2.0, python {sys.version.split()[0]}"
        )
    ]
    world.ops.switch("alpha")
    page = timed_gets(UnixHTTP(sock), args.n, {})
    fwd_conn = http.client.HTTPConnection("127.0.0.1", fwd.port, timeout=30)
    forwarded = timed_gets(fwd_conn, args.n, {"Cookie": f"{fwd.cookie}={fwd.token}"})
    started, served = [], []
    for i in range(args.switches):
        model = "beta" if i % 2 == 0 else "alpha"
        r, s = follow(agent, sock, model)
        lines.append(
            f"switch {i + 1:>2} -> {model:<5}: running shown after {r:7.1f} ms, serving shown after {s:7.1f} ms"
        )
        started.append(r)
        served.append(s)
        agent.jobs.join(timeout=30)
        while agent.jobs.running:
            time.sleep(0.01)
    lines += [
        summary("page GET / (unix socket)", page),
        summary("page GET / (forwarder)", forwarded),
        summary("switch shown running", started),
        summary("switch shown serving", served),
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fwd.shutdown()
    server.close()


if __name__ == "__main__":
    main()
