#!/usr/bin/env python3
"""Many handovers and stop-starts through the front proxy under a client-side prober, counted.

Boots one systemd test host; stand-in engines (0.2 s load, 20 ms per streamed token) under systemd
behind orchestrator-proxy.service (HAProxy 2.6). The prober (tests/proxy_prober.py, its own process)
runs 4 streaming workers (TOKENS tokens each) and 2 plain-completion workers on keep-alive
connections for the whole run. Counted: cut streams (200 but no [DONE] / finish_reason / fewer
tokens than asked), failed requests (anything but 200, or 503 + Retry-After in a stop-start's gap),
streams in flight across a route move, and each switch's drain. Raw records and per-switch figures
go to bench/proxy/handovers.json, the summary to stdout (kept as bench/proxy/handovers.txt).

    .venv/bin/python bench/proxy/proxy_handovers.py [--handovers 40] [--stop-starts 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator import settings
from orchestrator.wiring import operations
from tests.builders.drain import MODELS, TOKENS, ProberProcess, moves, recorder, spanning
from tests.builders.proxy import base_url, proxy_box
from tests.proxy_prober import classify


def run_case(ops: Any, url: str, pair: tuple[str, str], rounds: int) -> dict[str, Any]:
    events: list[tuple[float, str]] = []
    drains: list[float] = []
    switches = []
    t0 = time.monotonic()
    with ProberProcess(url, "chat") as prober:
        for i in range(rounds):
            s0 = time.monotonic()
            out = ops.switch(pair[i % 2], progress=recorder(events, drains))
            switches.append(
                {"to": out["model"], "outcome": out["outcome"], "switch_s": round(time.monotonic() - s0, 2)}
            )
    got = classify(prober.requests, TOKENS)
    streams = [r for r in prober.requests if r["kind"] == "stream"]
    return {
        "rounds": rounds,
        "took_s": round(time.monotonic() - t0, 1),
        "requests": len(prober.requests),
        "streams": len(streams),
        **{k: len(v) for k, v in got.items()},
        "streams_across_a_route_move": spanning(prober.requests, moves(events)),
        "outcomes": sorted({s["outcome"] for s in switches}),
        "switch_s": [s["switch_s"] for s in switches],
        "drain_s": drains,
        "non_200": [r for r in prober.requests if r["status"] != 200][:50],
        "cut_records": got["cut"],
        "failed_records": got["failed"],
        "raw": [
            [round(r["t0"], 3), round(r["t1"], 3), r["kind"], r["status"], r["tokens"], r["done"]]
            for r in prober.requests
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--handovers", type=int, default=40)
    ap.add_argument("--stop-starts", type=int, default=10)
    args = ap.parse_args()
    results: dict[str, Any] = {"tokens_per_stream": TOKENS, "engine_args": MODELS["chat-a"]["args"]}
    with proxy_box(MODELS) as (host, cfg):
        ops = operations(settings.load(cfg))
        ops.switch("chat-a")
        for case, pair, rounds in (
            ("handover", ("chat-b", "chat-a"), args.handovers),
            ("stop-start", ("chat-c", "chat-a"), args.stop_starts),
        ):
            results[case] = run_case(ops, base_url(host), pair, rounds)
            r = results[case]
            drains = sorted(r["drain_s"])
            print(
                f"{case}: {rounds} switches in {r['took_s']} s ({', '.join(r['outcomes'])}); "
                f"{r['requests']} requests ({r['streams']} streams): {r['ok']} ok, {r['cut']} cut, "
                f"{r['gap']} 503+Retry-After, {r['failed']} failed; {r['streams_across_a_route_move']} "
                f"streams in flight across a route move; switch {min(r['switch_s']):.2f}-"
                f"{max(r['switch_s']):.2f} s; drain median {drains[len(drains) // 2]:.2f} s, "
                f"max {drains[-1]:.2f} s",
                flush=True,
            )
            if ops.status(host.name)["hosts"][host.name]["models"][0]["model"] != "chat-a":
                ops.switch("chat-a")
        ops.stop("chat-a")
    (ROOT / "bench/proxy").mkdir(exist_ok=True)
    (ROOT / "bench/proxy/handovers.json").write_text(json.dumps(results, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
