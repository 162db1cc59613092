#!/usr/bin/env python3
"""The warm on-demand swap's own part, call by call: every port call the agent made between a swap's
decision and its release of the held requests, with its wall time (issue: warm switches at the engine's
own floor; the on-demand half).

Reads the agent's call log (bench/on_demand.py --calls FILE: the hooked test agent logs each adapter call
and progress event with its wall-clock start and end) and the swaps' records in bench/on_demand.json. Per
warm swap: the calls of the thread that ran it, grouped by the phase they fell in; then the median per
call (summed within a swap) over the swaps, and the time in no call (the agent's own Python).

    .venv/bin/python bench/warm/demand_calls.py CALLS.jsonl [--raw bench/on_demand.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def swaps_of(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The warm swaps (no cold start) whose records have an end."""
    return [
        d
        for d in raw["demand_deployments"]
        if d.get("ended_at") and not (d.get("demand") or {}).get("cold") and d.get("outcome") == "active"
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("calls", type=Path)
    ap.add_argument("--raw", type=Path, default=ROOT / "bench/on_demand.json")
    args = ap.parse_args()
    raw = json.loads(args.raw.read_text())
    lines = [json.loads(x) for x in args.calls.read_text().splitlines() if x.strip()]
    per_call: dict[str, list[float]] = defaultdict(list)
    outside: list[float] = []
    totals: list[float] = []
    swaps = swaps_of(raw)
    for swap in swaps:
        t_start, t_end = float(swap["created_at"]), float(swap["ended_at"])
        mine = [x for x in lines if t_start - 0.05 <= x["t0"] <= t_end]
        phases = [x for x in mine if x.get("event") == "phase"]
        if not phases:
            continue
        thread = phases[0]["thread"]
        mine = [x for x in mine if x["thread"] == thread]
        released = next(
            (x["t0"] for x in mine if x.get("event") == "phase" and x["fields"].get("phase") == "routing"), t_end
        )
        first = min(phases[0]["t0"], mine[0]["t0"])
        print(
            f"\n== {swap['model']} (deployment {swap['id']}): its first call to routing "
            f"{1000 * (released - first):.0f} ms"
        )
        summed: dict[str, float] = defaultdict(float)
        busy = 0.0
        for x in mine:
            if x["t0"] > released:
                break
            if "event" in x:
                if x["event"] == "phase":
                    print(f"  {1000 * (x['t0'] - first):6.0f} ms  -- {x['fields'].get('phase')}")
                continue
            ms = 1000 * (x["t1"] - x["t0"])
            summed[x["call"]] += ms
            busy += ms
            print(f"  {1000 * (x['t0'] - first):6.0f} ms  {ms:7.1f} ms  {x['call']}")
        for call, ms in summed.items():
            per_call[call].append(ms)
        total = 1000 * (released - first)
        totals.append(total)
        outside.append(total - busy)
    n = len(totals)
    print(f"\nper swap, median over {n} warm swaps (ms, calls summed within a swap; its first call to routing):")
    for call, vals in sorted(per_call.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {statistics.median(vals):7.1f}  ({len(vals):2d})  {call}")
    if totals:
        print(f"  {statistics.median(outside):7.1f}        in no port call (the agent's own code, the store, logs)")
        print(f"  {statistics.median(totals):7.1f}        in all")


if __name__ == "__main__":
    main()
