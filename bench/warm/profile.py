#!/usr/bin/env python3
"""The warm switch's critical path, call by call: where the time between "the route moves" and "the target
answers" goes (issue: warm switches at the engine's own floor).

One systemd test host, stand-in engines under systemd (wake 0.3 s, sleep 0.1 s: a floor of ~0.42 s with the
first token), the real HAProxy in front, a client through it (a completion every 50 ms). Every call the
switch makes on a port (proxy, engine control, GPU probe, systemd, shell, health) is timed by wrapping the
host's adapters in this process, and every progress event is time-stamped; for each warm switch it prints
the phases and, inside them, each call with its wall time, then the median per call across the switches.
The client-visible gap (longest time between two 200 answers) stands beside the engine's own sleep + wake.

    .venv/bin/python bench/warm/profile.py [--rounds 6] [--out bench/warm/profile-after.json]
(committed: profile-before.txt/.json before the window cuts, profile-after.txt/.json after)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator import settings
from orchestrator.wiring import operations
from tests.builders.proxy import PROXY_PORT, Prober, proxy_box
from tests.builders.timed import Timed

PORTS = ("proxy", "engine", "gpus", "systemd", "shell", "health", "weights")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/warm/profile-after.json", help="the raw rows")
    args = ap.parse_args()
    engine = ["--load-time", "2", "--wake-time", "0.3", "--sleep-time", "0.1"]
    warm = {
        "served_name": "chat",
        "gpus": [0, 1, 2, 3],
        "tensor_parallel": 4,
        "args": engine,
        "sleep": "level1",
        "wake_deadline_s": 10,
    }
    models = {"alpha": {"port": 8141, **warm}, "beta": {"port": 8142, **warm}}
    rows: list[dict[str, Any]] = []
    with proxy_box(models, host_keys="sleep_ram_gib = 8\n") as (host, cfg):
        ops = operations(settings.load(cfg))
        ops.switch("alpha")
        ops.switch("beta")  # alpha sleeps: from here on every switch is warm
        ports = ops.ports_for(host.name)
        calls: list[tuple[float, float, str]] = []
        for name in PORTS:
            inner = getattr(ports, name)
            if inner is not None:
                object.__setattr__(ports, name, Timed(inner, name, lambda a, b, c: calls.append((a, b, c))))
        url = f"http://{host.address}:{PROXY_PORT}/v1"
        for i in range(args.rounds):
            target = ("alpha", "beta")[i % 2]
            events: list[tuple[float, str, dict[str, Any]]] = []
            calls.clear()
            with Prober(url, "chat") as prober:
                time.sleep(0.3)
                t0 = time.monotonic()
                out = ops.switch(target, progress=lambda e, f, ev=events: ev.append((time.monotonic(), e, dict(f))))
                t1 = time.monotonic()
                time.sleep(0.3)
            phases = [(t, f.get("phase")) for t, e, f in events if e == "phase"]
            warm_steps = {f.get("step"): f.get("seconds") for _, e, f in events if e == "warm" and f.get("step")}
            timeline = [
                {"at_ms": round((a - t0) * 1000), "ms": round((b - a) * 1000, 1), "call": c}
                for a, b, c in sorted(calls)
            ]
            row = {
                "to": target,
                "outcome": out["outcome"],
                "switch_s": round(t1 - t0, 3),
                "gap_ms": round(prober.max_gap() * 1000),
                "failed": sum(1 for a in prober.answers if a[1] not in (200, 503)),
                "phases": [{"at_ms": round((t - t0) * 1000), "phase": p} for t, p in phases],
                "engine_s": warm_steps,
                "calls": timeline,
            }
            rows.append(row)
            print(
                f"\n== switch {i + 1} -> {target}: {row['outcome']} in {row['switch_s']} s, client gap "
                f"{row['gap_ms']} ms, engine {warm_steps}",
                flush=True,
            )
            marks = iter(row["phases"])
            mark = next(marks, None)
            for c in timeline:
                while mark is not None and mark["at_ms"] <= c["at_ms"]:
                    print(f"  {mark['at_ms']:6d} ms  -- phase {mark['phase']}")
                    mark = next(marks, None)
                print(f"  {c['at_ms']:6d} ms  {c['ms']:8.1f} ms  {c['call']}")
            for m in [mark, *marks]:
                if m is not None:
                    print(f"  {m['at_ms']:6d} ms  -- phase {m['phase']}")
        per: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            totals: dict[str, float] = defaultdict(float)
            for c in row["calls"]:
                totals[c["call"]] += c["ms"]
            for k, v in totals.items():
                per[k].append(v)
        print("\nper switch, median over the switches (ms, calls summed within a switch):")
        for k, v in sorted(per.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"  {statistics.median(v):8.1f}  {k}  (in {len(v)} of {len(rows)})")
        gaps = [r["gap_ms"] for r in rows]
        print(
            f"client gap median {statistics.median(gaps)} ms, max {max(gaps)} ms; switch median "
            f"{statistics.median(r['switch_s'] for r in rows):.2f} s; failed {sum(r['failed'] for r in rows)}"
        )
    args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
