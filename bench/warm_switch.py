#!/usr/bin/env python3
"""Warm switches as users run them, against the engine's own floor (issue 39's acceptance).

One systemd test host runs the product's agent (transport "local": D-Bus and a local shell, no SSH round
trips), the real HAProxy in front, and stand-in engines with sleep mode (sleep 0.1 s, wake 0.3 s, level 1;
--chunk-delay s a streamed token). The switches are asked for as an operator does: `orchestrator switch
MODEL` run in the host, which hands them to the agent's socket. alpha <-> beta share GPU 0-3: each switch
sleeps the one and wakes the other.

The client, from outside the host through the proxy (scripts/gpubox/prober.py): a 2-token completion every
50 ms and a 64-token stream (stream_options.include_usage) every second, each on its own connection. A
stream is cut unless it ends with [DONE], finish_reason "length" and a usage count of 64 tokens.

Per switch: the client-visible gap (the longest time between two 200 answers of the plain requests around
the switch); the engine's own floor = the displaced engine's sleep + the target's wake (their own "It took X
seconds ..." lines in the engines' journals) + the first token (a 1-token completion on the target's own
port right after the switch); gap - floor and gap / floor; the drain (the displaced engine waiting for its
in-flight streams before it sleeps: part of the gap by design); the switch's phases from `history`.
Goal: median(gap - floor) <= 0.1 s, max < 0.3 s, 0 failed, 0 cut, 0 503, 0 hung. Raw records to
bench/warm/raw.json, the summary to stdout (committed as bench/warm_switch.txt).

    flock /tmp/hosttests.lock .venv/bin/python bench/warm_switch.py [--rounds 10] [--chunk-delay 0.005]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine_floor import (
    Line,
    classify,
    engine_lines,
    engine_steps,
    first_token,
    load_prober,
    ms,
    standin_nvml,
)

from tests.builders.agent import STATE, cli, install_agent
from tests.builders.proxy import PROXY_PORT, proxy_config
from tests.hosts.pool import boot_hosts

PORTS = {"alpha": 8141, "beta": 8142}
DRIVER = ROOT / "bench/warm/agent_switch.py"  # runs in the host: the switch through the agent's socket
EVENTS = (
    "import json, sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(json.dumps([[a, k, json.loads(d)] "
    "for a, k, d in db.execute('SELECT at, kind, detail FROM events WHERE at >= ? ORDER BY at', "
    "(float(sys.argv[2]),))]))"
)
KINDS = ("ok", "503", "not_loaded", "cut", "failed", "hung")


def gap_around(records: list[dict[str, Any]], t0: float, t1: float) -> tuple[float, float, float]:
    """The longest time between two 200 answers of plain requests, over pairs that touch [t0, t1]: (the
    gap, its start, its end)."""
    oks = sorted(r["t1"] for r in records if r["kind"] == "plain" and r["status"] == 200)
    pairs = [(b - a, a, b) for a, b in itertools.pairwise(oks) if b >= t0 and a <= t1]
    return max(pairs, default=(0.0, t0, t0))


def counts(prober: Any, records: list[dict[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(KINDS, 0)
    for r in records:
        out[classify(prober, r)] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--load-time", type=float, default=1.0)
    ap.add_argument("--chunk-delay", type=float, default=0.005, help="stand-in seconds per streamed token")
    ap.add_argument(
        "--gpu-probe",
        choices=("nvml", "nvidia-smi"),
        default="nvml",
        help="how the agent reads GPU memory: the stand-in NVML (as on a GPU box) or the stand-in nvidia-smi",
    )
    ap.add_argument(
        "--via",
        choices=("socket", "cli"),
        default="socket",
        help="ask the agent through its socket as the CLI does (its progress events stamped), or run the CLI",
    )
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--summarise", action="store_true", help="only print the summary of bench/warm/raw.json")
    args = ap.parse_args()
    prober_mod = load_prober()
    rng = random.Random(args.seed)
    if args.summarise:
        report(prober_mod, json.loads((ROOT / "bench/warm/raw.json").read_text()))
        return
    engine = [
        "--load-time",
        str(args.load_time),
        "--wake-time",
        "0.3",
        "--sleep-time",
        "0.1",
        "--chunk-delay",
        str(args.chunk_delay),
    ]
    warm = {
        "served_name": "chat",
        "gpus": [0, 1, 2, 3],
        "tensor_parallel": 4,
        "args": engine,
        "sleep": "level1",
        "wake_deadline_s": 10,
    }
    models = {name: {"port": port, **warm} for name, port in PORTS.items()}
    raw: dict[str, Any] = {
        "engine_args": engine,
        "gpu_probe": args.gpu_probe,
        "load_before": os.getloadavg(),
        "switches": [],
    }
    hosts = boot_hosts(1)
    try:
        host = hosts.hosts[0]
        with tempfile.TemporaryDirectory() as tmp:
            config = proxy_config(host, Path(STATE), models).replace('transport = "ssh"', 'transport = "local"', 1)
            keys = "sleep_ram_gib = 8\n" + (
                standin_nvml(host) if args.gpu_probe == "nvml" else 'gpu_probe = "nvidia-smi"\n'
            )
            config = config.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\n{keys}", 1)
            install_agent(host, config, Path(tmp))
            for name in ("alpha", "beta", "alpha"):  # both engines exist afterwards, beta asleep
                cli(host, "switch", name)
            prober = prober_mod.Prober(host.address, PROXY_PORT, "chat").start()
            time.sleep(2.0)
            for i in range(args.rounds):
                target = ("beta", "alpha")[i % 2]
                t0, w0 = time.monotonic(), time.time()
                if args.via == "cli":
                    out, events = json.loads(cli(host, "switch", target, "--json").stdout), []
                else:
                    answer = json.loads(
                        host.run(host.python_command(str(DRIVER), f"{STATE}/agent.sock", target)).stdout
                    )
                    out, events = answer["result"], answer["events"]
                t1, w1 = time.monotonic(), time.time()
                first = first_token(host.address, PORTS[target], "chat")
                raw["switches"].append(
                    {
                        "to": target,
                        "id": out.get("id"),
                        "outcome": out.get("outcome"),
                        "t0": t0,
                        "t1": t1,
                        "w0": w0,
                        "w1": w1,
                        "first_token_s": first,
                        "events": events,
                    }
                )
                # streams started in the switch end; a random part so that the switches meet the streams (one a
                # second) at any point of theirs, not at one phase of them the loop happens to keep
                time.sleep(2.0 + rng.uniform(0.0, 1.0))
            records = prober.stop()
            lines = engine_lines(host, [f"vllm-{m}.service" for m in PORTS])
            hist = {d["id"]: d for d in json.loads(cli(host, "history", "--json", "--limit", "50").stdout)}
            stored = host.run_python(EVENTS, f"{STATE}/state.db", str(raw["switches"][0]["w0"] - 1), check=False)
            raw["agent_events"] = json.loads(stored.stdout or "[]")  # the agent's own records, stamped
            raw["load_after"] = os.getloadavg()  # the 2-core machine is shared: the figures move with it
            host.run(
                "systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'",
                check=False,
            )
    finally:
        hosts.close()
    for s in raw["switches"]:
        d = hist.get(s["id"]) or {}
        s["phases_s"] = {
            p["phase"]: round(p["seconds"], 3) for p in d.get("phases") or [] if p.get("seconds") is not None
        }
    raw["records"] = records
    raw["engine_lines"] = [vars(x) for x in lines]
    (ROOT / "bench/warm").mkdir(exist_ok=True)
    (ROOT / "bench/warm/raw.json").write_text(json.dumps(raw, indent=1))
    report(prober_mod, raw)


def span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def report(prober_mod: Any, raw: dict[str, Any]) -> None:
    records, switches = raw["records"], raw["switches"]
    lines = [Line(**x) for x in raw["engine_lines"]]
    print(
        f"engine: stand-in {' '.join(raw['engine_args'])}; the agent's GPU probe: "
        f"{raw.get('gpu_probe', 'nvidia-smi')}; load average before {raw['load_before'][0]:.1f}, "
        f"after {raw['load_after'][0]:.1f} (2 shared cores)"
    )
    print("  #  to     gap_ms sleep_ms wake_ms first_ms floor_ms gap-floor ratio stream_drain_ms plain/streams  bad")
    excess, excess_drain, ratios, gaps, floors = [], [], [], [], []
    prev = records[0]["t0"] if records else 0.0
    for i, s in enumerate(switches):
        s.update(engine_steps(lines, s["w0"], s["w1"]))
        gap, a, b = gap_around(records, s["t0"], s["t1"])
        # a stream the displaced engine still serves when the route moves: the drain waits for its end
        held = [r["t1"] for r in records if r["kind"] == "stream" and r["status"] == 200 and r["t0"] < a < r["t1"]]
        drain = max(0.0, min(max(held, default=a), b) - a)
        parts = (s["sleep_s"], s["wake_s"], s["first_token_s"])
        floor = sum(parts) if None not in parts else None
        window = [r for r in records if prev <= r["t0"] < s["t1"]]
        prev = s["t1"]
        c = counts(prober_mod, window)
        off = s["w0"] - s["t0"]  # monotonic -> wall clock, to set the client's times beside the journal's
        wake_called = None if s["woke_at"] is None else s["woke_at"] - s["wake_s"]
        s.update(
            gap_s=round(gap, 3),
            floor_s=floor,
            gap_at=(a + off, b + off),
            stream_drain_s=round(drain, 3),
            window=c,
            split_s={
                "route_to_sleep_call": span(a + off, s["sleep_called_at"]),
                "sleep_call": span(s["sleep_called_at"], s["asleep_at"]),
                "asleep_to_wake_call": span(s["asleep_at"], wake_called),
                "wake": s["wake_s"],
                "woken_to_answer": span(s["woke_at"], b + off),
            },
        )
        bad = {k: v for k, v in c.items() if k != "ok" and v}
        plain = sum(r["kind"] == "plain" for r in window)
        line = (
            f"{i + 1:3d}  {s['to']:6s} {ms(gap):>6s} {ms(s['sleep_s']):>8s} {ms(s['wake_s']):>7s} "
            f"{ms(s['first_token_s']):>8s} {ms(floor):>8s}"
        )
        if floor is not None:
            gaps.append(gap)
            floors.append(floor)
            excess.append(gap - floor)
            excess_drain.append(gap - floor - drain)
            ratios.append(gap / floor)
            line += f" {ms(gap - floor):>9s} {gap / floor:5.2f}"
        else:
            line += f" {'-':>9s} {'-':>5s}"
        print(line + f" {ms(drain):>15s} {plain:5d}/{len(window) - plain:<3d}  {bad or 0}", flush=True)
    print(
        "where each gap goes (ms; client's last 200 -> the engine's sleep call -> asleep -> wake call -> awake "
        "-> client's next 200, the journal's stamps) and the switch's phases (s, from `history`):"
    )
    print(
        "  #  (quiet wait: outcome) route->sleep_call (drained) sleep_call asleep->wake_call wake woken->answer  "
        "phases_s"
    )
    for i, s in enumerate(switches):
        sp = s["split_s"]
        # the agent's own record of its drain (warm note "drained", kept with the deployment since main 8fdd533)
        # and of its wait for a quiet moment before the route moved (warm note "quiet", before the gap opens)
        drained, quiet = (
            next(
                (
                    d
                    for _, kind, d in raw.get("agent_events") or []
                    if kind == "warm" and d.get("step") == step and d.get("deployment_id") == s["id"]
                ),
                {},
            )
            for step in ("drained", "quiet")
        )
        s["agent_drained_s"] = drained.get("seconds")
        s["quiet_s"], s["quiet_outcome"] = quiet.get("seconds"), quiet.get("outcome")
        waited = f"({ms(s['quiet_s'])}: {s['quiet_outcome'] or '-'})"
        drained_ms = "(" + ms(s["agent_drained_s"]) + ")"
        print(
            f"{i + 1:3d}  {waited:>21s} {ms(sp['route_to_sleep_call']):>17s} {drained_ms:>9s} "
            f"{ms(sp['sleep_call']):>10s} {ms(sp['asleep_to_wake_call']):>17s} {ms(sp['wake']):>4s} "
            f"{ms(sp['woken_to_answer']):>13s}  {s['phases_s']}"
        )
    if any(s.get("events") for s in switches):
        print(
            "the agent's progress events inside each gap (ms after the client's last 200; stamped as they reach "
            "the caller in the host):"
        )
        for i, s in enumerate(switches):
            start, end = s["gap_at"]
            marks = []
            for at, event, fields in s.get("events") or []:
                if start - 0.05 <= at <= end:
                    what = fields.get("phase") if event == "phase" else fields.get("step") if event == "warm" else ""
                    took = f" {fields['seconds']:g}s" if isinstance(fields.get("seconds"), int | float) else ""
                    marks.append(f"{event}{':' + str(what) if what else ''}{took} {ms(at - start)}")
            print(f"{i + 1:3d}  " + ", ".join(marks))
    total = counts(prober_mod, records)
    outcomes = sorted({str(s["outcome"]) for s in switches})
    print(
        f"requests: {len(records)} ({sum(r['kind'] == 'stream' for r in records)} streams of 64 tokens); "
        f"{total}; switch outcomes {outcomes}"
    )
    if not excess:
        print("FAIL: no switch with the engine's own sleep and wake lines")
        return
    for key in ("route_to_sleep_call", "sleep_call", "asleep_to_wake_call", "woken_to_answer"):
        vals = [s["split_s"][key] for s in switches if s["split_s"][key] is not None]
        if vals:
            print(f"  {key}: median {ms(statistics.median(vals))} ms, max {ms(max(vals))} ms")
    waits = [s["quiet_s"] for s in switches if s.get("quiet_s") is not None]
    if waits:  # before the gap opens: the displaced engine still serves meanwhile
        ends = [str(s.get("quiet_outcome")) for s in switches if s.get("quiet_s") is not None]
        print(
            f"  quiet wait before the route moved (not in the gap): median {ms(statistics.median(waits))} ms, "
            f"max {ms(max(waits))} ms; ended {', '.join(f'{k} {ends.count(k)}' for k in sorted(set(ends)))}"
        )
    med, worst = statistics.median(excess), max(excess)
    print(
        f"gap: median {ms(statistics.median(gaps))} ms, max {ms(max(gaps))} ms; floor (sleep + wake + first "
        f"token): median {ms(statistics.median(floors))} ms; gap - floor: median {ms(med)} ms, max {ms(worst)} "
        f"ms; ratio gap / floor: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}"
    )
    print(
        f"gap - floor - stream drain (the displaced engine finishing a stream): median "
        f"{ms(statistics.median(excess_drain))} ms, max {ms(max(excess_drain))} ms"
    )
    zero = all(total[k] == 0 for k in ("503", "failed", "cut", "hung", "not_loaded"))
    ok = med <= 0.1 and worst < 0.3 and zero and outcomes == ["active"]
    print(
        f"{'PASS' if ok else 'FAIL'}: median gap - floor {ms(med)} ms (goal <= 100), max {ms(worst)} ms "
        f"(goal < 300), failed {total['failed']}, cut {total['cut']}, 503 {total['503']}, hung {total['hung']}, "
        f"not_loaded {total['not_loaded']} (goal 0 each), over {len(switches)} switches"
    )


if __name__ == "__main__":
    main()
