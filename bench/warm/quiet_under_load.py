#!/usr/bin/env python3
"""How long a warm switch's quiet wait waits when the displaced engine is never idle (issue 39's caveat).

The set-up of bench/warm_switch.py (the agent in one systemd test host, transport local, stand-in NVML, the
real HAProxy; alpha <-> beta served as "chat", sleep 0.1 s, wake 0.3 s, 5 ms a streamed token), but the
client is closed-loop: CLIENTS threads, each sending the next 16-token completion for "chat" as soon as the
last answered, from outside the host through the proxy, so that a request is always in flight at the
serving engine. Each switch is asked through the agent's socket (bench/warm/agent_switch.py); per switch the
agent's own `quiet` event (seconds waited, outcome, what was in flight at the move) and `drained`, and the
client's longest time between two answers around the switch. `[proxy] quiet_wait_s` is the default (2 s).
Prints the table; raw records to bench/warm/quiet-under-load.json.

    flock /tmp/hosttests.lock .venv/bin/python bench/warm/quiet_under_load.py [--rounds 6] [--clients 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
for p in (ROOT, ROOT / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from engine_floor import standin_nvml

from tests.builders.agent import STATE, cli, install_agent
from tests.builders.proxy import PROXY_PORT, proxy_config
from tests.hosts.pool import boot_hosts

PORTS = {"alpha": 8141, "beta": 8142}
DRIVER = ROOT / "bench/warm/agent_switch.py"


def client(url: str, stop: threading.Event, out: list[tuple[float, float, int | str]]) -> None:
    """Closed loop: the next request as soon as the last one answered; (start, end, status) each."""
    with httpx.Client(timeout=30.0) as http:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                status: int | str = http.post(
                    url, json={"model": "chat", "prompt": "hi", "max_tokens": 16, "stream": True}
                ).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            out.append((t0, time.monotonic(), status))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--clients", type=int, default=3)
    args = ap.parse_args()
    engine = ["--load-time", "1.0", "--wake-time", "0.3", "--sleep-time", "0.1", "--chunk-delay", "0.005"]
    warm = {"served_name": "chat", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "args": engine, "sleep": "level1"}
    models = {name: {"port": port, **warm, "wake_deadline_s": 10} for name, port in PORTS.items()}
    raw: dict[str, Any] = {"engine_args": engine, "clients": args.clients, "load_before": os.getloadavg()}
    switches: list[dict[str, Any]] = []
    answers: list[tuple[float, float, int | str]] = []
    hosts = boot_hosts(1)
    try:
        host = hosts.hosts[0]
        with tempfile.TemporaryDirectory() as tmp:
            config = proxy_config(host, Path(STATE), models).replace('transport = "ssh"', 'transport = "local"', 1)
            keys = "sleep_ram_gib = 8\n" + standin_nvml(host)
            install_agent(host, config.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\n{keys}", 1), Path(tmp))
            for name in ("alpha", "beta", "alpha"):
                cli(host, "switch", name)
            stop = threading.Event()
            url = f"http://{host.address}:{PROXY_PORT}/v1/completions"
            threads = [threading.Thread(target=client, args=(url, stop, answers)) for _ in range(args.clients)]
            for t in threads:
                t.start()
            time.sleep(2.0)
            for i in range(args.rounds):
                target = ("beta", "alpha")[i % 2]
                t0 = time.monotonic()
                answer = json.loads(host.run(host.python_command(str(DRIVER), f"{STATE}/agent.sock", target)).stdout)
                t1 = time.monotonic()
                ev = {e: f for _, e, f in answer["events"] if e in ("quiet", "drained")}
                switches.append(
                    {"to": target, "t0": t0, "t1": t1, "outcome": answer["result"].get("outcome"), "events": ev}
                )
                time.sleep(2.0)
            stop.set()
            for t in threads:
                t.join()
            raw["load_after"] = os.getloadavg()
            host.run("systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'")
    finally:
        hosts.close()
    raw["switches"], raw["answers"] = switches, answers
    (ROOT / "bench/warm/quiet-under-load.json").write_text(json.dumps(raw, indent=1))
    report(raw)


def report(raw: dict[str, Any]) -> None:
    answers = raw["answers"]
    bad = [a for a in answers if a[2] != 200]
    print(
        f"{raw['clients']} closed-loop clients (16-token streams); engine: stand-in {' '.join(raw['engine_args'])}; "
        f"load average before {raw['load_before'][0]:.1f}, after {raw['load_after'][0]:.1f} (2 shared cores)"
    )
    print("  #  to     quiet_wait_s outcome  in_flight_at_move  drained_s  switch_s  longest_no_answer_s")
    waits = []
    for i, s in enumerate(raw["switches"], 1):
        q, d = s["events"].get("quiet", {}), s["events"].get("drained", {})
        ends = sorted(b for _, b, st in answers if st == 200)
        gaps = [b - a for a, b in itertools.pairwise(ends) if b >= s["t0"] and a <= s["t1"]]
        waits.append(q.get("seconds", 0.0))
        print(
            f"{i:3d}  {s['to']:6s} {q.get('seconds', '-'):>12} {q.get('outcome', '-'):8s} "
            f"{q.get('in_flight', '-'):>17} {d.get('seconds', '-'):>10} {s['t1'] - s['t0']:9.2f} "
            f"{max(gaps, default=0.0):20.3f}"
        )
    print(
        f"requests: {len(answers)}, not 200: {len(bad)}; outcomes {sorted({s['outcome'] for s in raw['switches']})}; "
        f"quiet wait median {statistics.median(waits):.3f} s, max {max(waits):.3f} s"
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--summarise"]:
        report(json.loads((ROOT / "bench/warm/quiet-under-load.json").read_text()))
    else:
        main()
