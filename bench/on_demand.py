#!/usr/bin/env python3
"""Models on demand through the front proxy: how long a request waits for its model, and what a
mixed A/B workload costs against a box that serves only A.

Boots one systemd test host with the agent (its broker on the demand socket) and the real HAProxy
holding requests in its Lua; stand-in engines with sleep mode (cold load 2 s, wake 0.3 s, sleep
0.1 s, 20 ms a token); alpha and beta share GPU 0-3, gamma has GPU 4-7 (tests/builders/demand.py).
  warm   one client alternates alpha and beta: every request waits for one warm on-demand swap
  cold   gamma stopped (`orchestrator stop gamma`), then one request for it: a cold start on demand
  mixed  two clients alternate alpha and beta for --seconds; tokens/s of 16-token completions
  only-a two clients ask for alpha only, for as long (the box serving one model)
Wait = the client's whole request time (held, then served). Raw answers to bench/on_demand.json,
the summary to stdout (committed as bench/on_demand.txt).

    .venv/bin/python bench/on_demand.py [--rounds 8] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.builders.agent import STATE, cli, install_agent
from tests.builders.demand import AB, Answer, Client, demand_config, url
from tests.hosts.pool import boot_hosts


def spread(waits: list[float]) -> dict[str, float]:
    w = sorted(waits)
    q = statistics.quantiles(w, n=10, method="inclusive") if len(w) > 1 else w * 9
    return {"n": len(w), "p50_s": round(statistics.median(w), 3), "p90_s": round(q[8], 3), "max_s": round(w[-1], 3)}


def throughput(answers: list[Answer], seconds: float) -> dict[str, Any]:
    ok = [a for a in answers if a.status == 200]
    return {"requests": len(answers), "ok": len(ok), "failed": sum(a.failed for a in answers),
            "tokens": sum(a.tokens for a in ok), "tok_s": round(sum(a.tokens for a in ok) / seconds, 1)}


def timed(clients: list[Client], seconds: float) -> float:
    for c in clients:
        c.__enter__()
    t0 = time.monotonic()
    time.sleep(seconds)
    for c in clients:
        c.stop()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--summarise", action="store_true", help="only recompute the summary from bench/on_demand.json")
    args = ap.parse_args()
    if args.summarise:
        data = json.loads((ROOT / "bench/on_demand.json").read_text())
        raw = {k: v for k, v in data.items() if k not in ("summary", "mixed_s", "only_s")}
        report(raw, data.get("mixed_s", args.seconds), data.get("only_s", args.seconds))
        return
    hosts = boot_hosts(1)
    raw: dict[str, Any] = {"load_before": os.getloadavg()}
    try:
        host = hosts.hosts[0]
        with tempfile.TemporaryDirectory() as tmp:
            install_agent(host, demand_config(host, Path(STATE), AB, max_swaps_per_min=60, batch_wait_s=1.0), Path(tmp))
            cli(host, "switch", "beta")
            cli(host, "switch", "alpha")  # beta asleep: both one wake away
            base = url(host)

            warm = Client(base, ["beta", "alpha"], rounds=args.rounds)
            warm.__enter__()
            warm.join(600)
            raw["warm"] = [asdict(a) for a in warm.answers]

            cold: list[Answer] = []
            for _ in range(max(1, args.rounds // 2)):
                one = Client(base, ["gamma"], rounds=1)
                one.__enter__()
                one.join(120)
                cold += one.answers
                cli(host, "stop", "gamma")
            raw["cold"] = [asdict(a) for a in cold]

            mixed = [Client(base, ["alpha", "beta"], max_tokens=16), Client(base, ["beta", "alpha"], max_tokens=16)]
            mixed_s = timed(mixed, args.seconds)
            cli(host, "switch", "alpha")
            only = [Client(base, ["alpha"], max_tokens=16), Client(base, ["alpha"], max_tokens=16)]
            only_s = timed(only, args.seconds)
            raw["mixed"] = [asdict(a) for c in mixed for a in c.answers]
            raw["only_a"] = [asdict(a) for c in only for a in c.answers]
            demand = [d for d in json.loads(cli(host, "history", "--json", "--limit", "200").stdout)
                      if str(d.get("trigger", "")).startswith("demand:")]
            raw["demand_deployments"] = [{k: d.get(k) for k in ("id", "model", "outcome", "created_at", "ended_at",
                                                                "demand", "phases")} for d in demand]
            raw["load_after"] = os.getloadavg()  # this 2-core machine is shared: the figures move with it
            host.run("systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'",
                     check=False)
    finally:
        hosts.close()
    report(raw, mixed_s, only_s)


def report(raw: dict[str, Any], mixed_s: float, only_s: float) -> None:
    """The summary (stdout) and the raw file, from the raw answers."""

    def answers(key: str) -> list[Answer]:
        return [Answer(**a) for a in raw[key]]

    warm, cold, mixed, only = answers("warm"), answers("cold"), answers("mixed"), answers("only_a")
    summary = {
        "warm_swap_wait": spread([a.wait for a in warm if a.status == 200]),
        "warm_failed": sum(a.failed for a in warm),
        "cold_start_wait": spread([a.wait for a in cold if a.status == 200]),
        "cold_failed": sum(a.failed for a in cold),
        "mixed_a_b": {**throughput(mixed, mixed_s), "429": sum(a.status == 429 for a in mixed)},
        "only_a": throughput(only, only_s),
        "demand_swaps": len(raw["demand_deployments"]),
        "load_average": [raw.get("load_before"), raw.get("load_after")],
    }
    for key, value in summary.items():
        print(f"{key}: {value}", flush=True)
    mixed_tok, only_tok = summary["mixed_a_b"]["tok_s"], summary["only_a"]["tok_s"]
    print(f"mixed A/B serves {mixed_tok} tok/s, {100 * mixed_tok / only_tok:.0f}% of a box serving only A "
          f"({only_tok} tok/s)", flush=True)
    (ROOT / "bench/on_demand.json").write_text(json.dumps({"summary": summary, "mixed_s": mixed_s,
                                                           "only_s": only_s, **raw}, indent=1))


if __name__ == "__main__":
    main()
