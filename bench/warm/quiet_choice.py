#!/usr/bin/env python3
"""What "quiet" should mean before a warm switch moves its route, replayed on the bench's real client
traffic (bench/warm_switch.py's prober records: a 2-token completion every 50 ms, a 64-token stream
every second, each as the client timed it).

For a switch asked at any instant (every 1 ms of the recording, outside the switches themselves), the
product reads the displaced engine's in-flight count every POLL_S and moves the route when the rule
says; the route move itself takes --route-ms (from the reading to the agent's `routed` event, measured in
bench/warm_switch.py's runs), and whatever is in flight to the old engine when it lands (started before,
or during the move) must end before the engine sleeps: that remainder is what the switch adds to every
client's gap. Rules:

* zero: no request in flight;
* age <= A ms: every request in flight started at most A ms ago (HAProxy's `show stat` has no ages,
  `show sess` has them to the second, so this is a what-if);
* none: move at once (the code before the wait).

Each rule's wait before the route moves (the displaced engine still serves: nobody waits) and the
drain left in the gap, median / p99 / max.

    .venv/bin/python bench/warm/quiet_choice.py [bench/warm/raw.json] [--bound 2.0] [--route-ms 145,60]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.01  # core/quiet.py QUIET_POLL_S


def pct(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * len(s)))]


def replay(
    spans: list[tuple[float, float]], start: float, rule: str, age: float, bound: float, route_s: float
) -> tuple[float, float]:
    """(the wait before the route moves, the drain left once it moved) for a switch asked at ``start``."""
    t = start
    while True:
        live = [(a, b) for a, b in spans if a <= t < b]
        if rule == "none" or t - start >= bound:
            break
        if rule == "zero" and not live:
            break
        if rule == "age" and all(t - a <= age for a, _ in live):
            break
        t += POLL_S
    landed = t + route_s
    held = [b for a, b in spans if a < landed and b > landed]
    return t - start, max((b - landed for b in held), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw", nargs="?", default=str(ROOT / "bench/warm/raw.json"))
    ap.add_argument("--bound", type=float, default=2.0)
    ap.add_argument("--route-ms", default="145,60", help="route move times to replay, ms (comma-separated)")
    args = ap.parse_args()
    raw: dict[str, Any] = json.loads(Path(args.raw).read_text())
    switches = [(s["t0"], s["t1"]) for s in raw["switches"]]

    def outside(a: float, b: float) -> bool:
        return not any(a < t1 + 0.5 and b > t0 - 0.5 for t0, t1 in switches)

    records = [r for r in raw["records"] if r["status"] == 200 and outside(r["t0"], r["t1"])]
    spans = sorted((r["t0"], r["t1"]) for r in records)
    plain = [b - a for a, b in ((r["t0"], r["t1"]) for r in records if r["kind"] == "plain")]
    stream = [b - a for a, b in ((r["t0"], r["t1"]) for r in records if r["kind"] == "stream")]
    lo, hi = spans[0][0] + 1, spans[-1][1] - 3
    starts = [lo + i * 0.001 for i in range(int((hi - lo) / 0.001)) if outside(lo + i * 0.001, lo + i * 0.001)]
    busy = sum(1 for t in starts if any(a <= t < b for a, b in spans)) / len(starts)
    print(
        f"traffic outside the switches: {len(plain)} plain requests "
        f"(median {statistics.median(plain) * 1e3:.0f} ms), "
        f"{len(stream)} streams (median {statistics.median(stream) * 1e3:.0f} ms); something in flight "
        f"{busy:.0%} of the time; {len(starts[::7])} switch instants, a reading every {POLL_S * 1e3:.0f} ms, "
        f"bound {args.bound:g} s"
    )
    for route_ms in (float(x) for x in args.route_ms.split(",")):
        print(f"route move {route_ms:g} ms:")
        print(
            f"  {'rule':12s} {'wait median/p99/max ms':>24s} {'drain in the gap median/p99/max ms':>36s} "
            f"{'drain > 50 ms':>14s}"
        )
        for rule, age in (("none", 0.0), ("zero", 0.0), ("age", 0.005), ("age", 0.02), ("age", 0.05)):
            out = [replay(spans, t, rule, age, args.bound, route_ms / 1e3) for t in starts[::7]]
            waits, drains = [w for w, _ in out], [d for _, d in out]
            name = rule if rule != "age" else f"age<={age * 1e3:.0f}ms"
            print(
                f"  {name:12s} {statistics.median(waits) * 1e3:8.0f} /{pct(waits, 0.99) * 1e3:5.0f} /"
                f"{max(waits) * 1e3:5.0f} {statistics.median(drains) * 1e3:18.0f} /{pct(drains, 0.99) * 1e3:5.0f} /"
                f"{max(drains) * 1e3:5.0f} {sum(d > 0.05 for d in drains) / len(drains):13.1%}"
            )


if __name__ == "__main__":
    main()
