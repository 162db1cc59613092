#!/usr/bin/env python3
"""Downtime as clients see it through the front proxy, beside the same switch on direct ports.

Boots one systemd test host; stand-in engines (load time L) under systemd; a prober sends a
completion every 50 ms for the whole switch. Three cases, ROUNDS switches each:
  proxy-disjoint  chat-a <-> chat-b (GPU 0-3 / 4-7, both served as "chat"): a handover
  proxy-overlap   chat-a <-> chat-c (both GPU 0-3): stop-start, the proxy answers 503 + Retry-After
  direct          alpha <-> beta without the proxy (both GPU 0-3), probing each model's own port
Failed = anything but 200 (proxy: anything but 200 or 503 with Retry-After). Gap = longest time
between two 200 answers. Raw answers go to bench/proxy/raw.json.

    .venv/bin/python bench/proxy/proxy_downtime.py [--rounds 4] [--load-time 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator import settings
from orchestrator.wiring import operations
from tests.builders.proxy import PROXY_PORT, Prober, proxy_box
from tests.builders.switch import config_text


class DirectProber(Prober):
    """Probes whichever of two direct ports answers: the client knows both URLs (the best case)."""

    urls: tuple[str, str] = ("", "")

    def run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                status: int | str = "refused"
                for url, model in zip(self.urls, ("alpha", "beta"), strict=True):
                    try:
                        r = client.post(f"{url}/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                        continue
                    status = r.status_code
                    if status == 200:
                        break
                self.answers.append((time.monotonic(), status, None))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))


def summarise(prober: Prober, proxy: bool) -> dict[str, Any]:
    ok = [a for a in prober.answers if a[1] == 200]
    gap503 = [a for a in prober.answers if a[1] == 503 and a[2]]
    failed = [a for a in prober.answers if a[1] != 200 and not (proxy and a in gap503)]
    return {
        "probes": len(prober.answers),
        "ok": len(ok),
        "503_retry_after": len(gap503),
        "failed": len(failed),
        "longest_gap_ms": round(prober.max_gap() * 1000),
        "answers": [[round(t, 3), s, r] for t, s, r in prober.answers],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--load-time", type=float, default=2.0)
    args = ap.parse_args()
    lt = ["--load-time", str(args.load_time)]
    tp4 = {"tensor_parallel": 4}
    models = {
        "chat-a": {"port": 8101, "served_name": "chat", "gpus": [0, 1, 2, 3], **tp4, "args": lt},
        "chat-b": {"port": 8102, "served_name": "chat", "gpus": [4, 5, 6, 7], **tp4, "args": lt},
        "chat-c": {"port": 8103, "served_name": "chat", "gpus": [0, 1, 2, 3], **tp4, "args": lt},
    }
    direct = {"alpha": {"port": 8111, **tp4, "args": lt}, "beta": {"port": 8112, **tp4, "args": lt}}
    results: dict[str, list[dict[str, Any]]] = {"proxy-disjoint": [], "proxy-overlap": [], "direct": []}
    with proxy_box(models) as (host, cfg):
        ops = operations(settings.load(cfg))
        url = f"http://{host.address}:{PROXY_PORT}/v1"
        ops.switch("chat-a")
        for case, pair in (("proxy-disjoint", ("chat-b", "chat-a")), ("proxy-overlap", ("chat-c", "chat-a"))):
            for i in range(args.rounds):
                with Prober(url, "chat") as prober:
                    t0 = time.monotonic()
                    out = ops.switch(pair[i % 2])
                    took = time.monotonic() - t0
                    time.sleep(0.3)
                results[case].append(
                    {
                        "to": out["model"],
                        "outcome": out["outcome"],
                        "switch_s": round(took, 2),
                        **summarise(prober, proxy=True),
                    }
                )
                print(
                    case,
                    results[case][-1]["to"],
                    {k: v for k, v in results[case][-1].items() if k != "answers"},
                    flush=True,
                )
            if ops.status(host.name)["hosts"][host.name]["models"][0]["model"] != "chat-a":
                ops.switch("chat-a")
        ops.stop("chat-a")
        dcfg = cfg.parent / "direct.toml"
        dcfg.write_text(config_text(host, cfg.parent / "dstate", direct))
        dops = operations(settings.load(dcfg))
        dops.switch("alpha")
        for i in range(args.rounds):
            prober = DirectProber("", "")
            prober.urls = (f"http://{host.address}:8111/v1", f"http://{host.address}:8112/v1")
            with prober:
                t0 = time.monotonic()
                out = dops.switch(("beta", "alpha")[i % 2])
                took = time.monotonic() - t0
                time.sleep(0.3)
            results["direct"].append(
                {
                    "to": out["model"],
                    "outcome": out["outcome"],
                    "switch_s": round(took, 2),
                    **summarise(prober, proxy=False),
                }
            )
            print("direct", {k: v for k, v in results["direct"][-1].items() if k != "answers"}, flush=True)
    (ROOT / "bench/proxy").mkdir(exist_ok=True)
    (ROOT / "bench/proxy/raw.json").write_text(json.dumps({"load_time_s": args.load_time, **results}, indent=1))


if __name__ == "__main__":
    main()
