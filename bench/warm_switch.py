#!/usr/bin/env python3
"""Client-visible downtime of cold against warm switches through the front proxy, in the same run.

Boots one systemd test host; stand-in engines (cold load 2 s, wake 0.3 s, sleep 0.1 s) under
systemd, the real HAProxy in front; a prober sends a 2-token completion every 50 ms through the
proxy for the whole switch. Two cases, ROUNDS switches each, on the same GPUs 0-3:
  cold  chat-a <-> chat-c without sleep mode: stop-start, the proxy answers 503 + Retry-After
  warm  alpha <-> beta with sleep = "level1": the displaced engine sleeps, the target wakes
Downtime = the longest time between two 200 answers (a request held during a wake counts as down
until it answers). Failed = anything but 200 and 503 with Retry-After. The phases of each switch
(from `history`) and the warm steps' own figures (sleep and wake seconds) go with it; raw answers
to bench/warm/raw.json, the summary to stdout (committed as bench/warm_switch.txt).

    .venv/bin/python bench/warm_switch.py [--rounds 6] [--load-time 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator import settings
from orchestrator.wiring import operations
from tests.builders.proxy import PROXY_PORT, Prober, proxy_box


def summarise(prober: Prober) -> dict[str, Any]:
    ok = [a for a in prober.answers if a[1] == 200]
    gap503 = [a for a in prober.answers if a[1] == 503 and a[2]]
    failed = [a for a in prober.answers if a[1] != 200 and a not in gap503]
    return {"probes": len(prober.answers), "ok": len(ok), "503_retry_after": len(gap503), "failed": len(failed),
            "downtime_ms": round(prober.max_gap() * 1000),
            "answers": [[round(t, 3), s, r] for t, s, r in prober.answers]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--load-time", type=float, default=2.0)
    args = ap.parse_args()
    engine = ["--load-time", str(args.load_time), "--wake-time", "0.3", "--sleep-time", "0.1"]
    base = {"served_name": "chat", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "args": engine}
    warm = {**base, "sleep": "level1", "wake_deadline_s": 10}
    models = {"chat-a": {"port": 8131, **base}, "chat-c": {"port": 8133, **base},
              "alpha": {"port": 8141, **warm}, "beta": {"port": 8142, **warm}}
    results: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    with proxy_box(models, host_keys="sleep_ram_gib = 8\n") as (host, cfg):
        ops = operations(settings.load(cfg))
        url = f"http://{host.address}:{PROXY_PORT}/v1"
        for case, pair in (("cold", ("chat-c", "chat-a")), ("warm", ("beta", "alpha"))):
            ops.switch(pair[1])
            if case == "warm":
                ops.switch(pair[0])  # one cold round first: afterwards both engines exist, one asleep
                ops.switch(pair[1])
            for i in range(args.rounds):
                with Prober(url, "chat") as prober:
                    time.sleep(0.3)
                    t0 = time.monotonic()
                    out = ops.switch(pair[i % 2])
                    took = time.monotonic() - t0
                    time.sleep(0.3)
                phases = {p["phase"]: p["seconds"] for p in ops.history(host.name, 1)[0]["phases"]}
                warm_steps = [{k: e.get(k) for k in ("step", "model", "seconds")}
                              for e in reversed(ops.store.events(host=host.name, kind="warm", limit=20))
                              if e.get("deployment_id") == out["id"] and e.get("seconds") is not None]
                results[case].append({"to": out["model"], "outcome": out["outcome"], "switch_s": round(took, 2),
                                      "phases_s": phases, "warm_steps": warm_steps, **summarise(prober)})
                row = results[case][-1]
                print(case, row["to"], {k: v for k, v in row.items() if k not in ("answers", "to")}, flush=True)
            for name in pair:
                if any(m["model"] == name for m in ops.status(host.name)["hosts"][host.name].get("models", [])):
                    ops.stop(name)
        for case, rows in results.items():
            down = [r["downtime_ms"] for r in rows]
            print(f"{case}: downtime median {statistics.median(down):.0f} ms, max {max(down)} ms; "
                  f"failed {sum(r['failed'] for r in rows)}, 503 {sum(r['503_retry_after'] for r in rows)}, "
                  f"outcomes {sorted({r['outcome'] for r in rows})}; switch median "
                  f"{statistics.median(r['switch_s'] for r in rows):.2f} s", flush=True)
    (ROOT / "bench/warm").mkdir(exist_ok=True)
    (ROOT / "bench/warm/raw.json").write_text(json.dumps({"load_time_s": args.load_time, **results}, indent=1))


if __name__ == "__main__":
    main()
