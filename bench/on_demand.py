#!/usr/bin/env python3
"""Models on demand through the front proxy: how long a request waits for its model against the engine's own
floor, and what a mixed A/B workload costs against a box that serves only A.

Boots one systemd test host with the product's agent (transport "local", its broker on the demand socket)
and the real HAProxy holding requests in its Lua; stand-in engines with sleep mode (cold load 2 s, wake
0.3 s, sleep 0.1 s, 20 ms a token); alpha and beta share GPU 0-3, gamma has GPU 4-7 (tests/builders/demand.py);
[demand] batch_wait_s = 1.
  warm   one client alternates alpha and beta: every request waits for one warm on-demand swap
  cold   gamma stopped (`orchestrator stop gamma`), then one request for it: a cold start on demand
  mixed  two clients alternate alpha and beta for --seconds; tokens/s of 16-token completions
  only-a two clients ask for alpha only, for as long (the box serving one model)
Wait = the client's whole request time (held, then served). Per request: its floor = the displaced engine's
sleep + the requested engine's wake (their own "It took X seconds ..." lines in the engines' journals, inside
the request's time) + what the request itself takes on an awake engine's own port (median of 5); the
batching bound = batch_wait_s when another model had a request in flight as this one arrived (the only case
batch_wait_s applies), or the rest of that bound when it joined requests for its model held so; the swap
cap's wait = the rest of max_swaps_per_min's spacing after the previous swap's decision; the excess = wait -
floor - bound (printed), and over the bounds the operator set = wait - floor - max(bound, cap's wait); the
swap's own part = its decision to its release less the engines' sleep and wake. Goal: over the bounds,
median <= 0.1 s, max < 0.3 s, 0 failed.
Raw answers to bench/on_demand.json, the summary to stdout (committed as bench/on_demand.txt).

    flock /tmp/hosttests.lock .venv/bin/python bench/on_demand.py [--rounds 10] [--seconds 20]
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

from engine_floor import Line, engine_lines, engine_steps, first_token, ms, standin_nvml

from tests.builders.agent import STATE, cli, install_agent
from tests.builders.demand import AB, Answer, Client, demand_config, url
from tests.builders.proxy_state import proxy_state
from tests.hosts.pool import boot_hosts

BATCH_WAIT_S = 1.0
MAX_SWAPS_PER_MIN = 60  # the swap cap: swaps at least 60 / this seconds apart (core/demand.py swap_spacing_s)


def spread(waits: list[float]) -> dict[str, float]:
    w = sorted(waits)
    if not w:
        return {"n": 0}
    q = statistics.quantiles(w, n=10, method="inclusive") if len(w) > 1 else w * 9
    return {"n": len(w), "p50_s": round(statistics.median(w), 3), "p90_s": round(q[8], 3), "max_s": round(w[-1], 3)}


def throughput(answers: list[Answer], seconds: float) -> dict[str, Any]:
    ok = [a for a in answers if a.status == 200]
    return {
        "requests": len(answers),
        "ok": len(ok),
        "failed": sum(a.failed for a in answers),
        "tokens": sum(a.tokens for a in ok),
        "tok_s": round(sum(a.tokens for a in ok) / seconds, 1),
    }


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
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cold-rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--summarise", action="store_true", help="only recompute the summary from bench/on_demand.json")
    ap.add_argument("--profile-out", type=Path, help="also write the warm swaps' profile (their timelines) there")
    ap.add_argument(
        "--calls", type=Path, help="also write the agent's every port call and event there (bench/warm/demand_calls.py)"
    )
    ap.add_argument(
        "--raw", type=Path, default=ROOT / "bench/on_demand.json", help="raw: a run writes it, --summarise reads it"
    )
    args = ap.parse_args()
    if args.summarise:
        raw = json.loads(args.raw.read_text())
        report(raw)
        if args.profile_out:
            args.profile_out.write_text(profile(raw))
        return
    hosts = boot_hosts(1)
    raw: dict[str, Any] = {"load_before": os.getloadavg(), "batch_wait_s": BATCH_WAIT_S}
    try:
        host = hosts.hosts[0]
        with tempfile.TemporaryDirectory() as tmp:
            config = demand_config(
                host, Path(STATE), AB, max_swaps_per_min=MAX_SWAPS_PER_MIN, batch_wait_s=BATCH_WAIT_S
            )
            config = config.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\n{standin_nvml(host)}", 1)
            calls_log = "/var/log/orchestrator-calls.jsonl"
            install_agent(host, config, Path(tmp), hook_args=f"--time-calls {calls_log}" if args.calls else "")
            cli(host, "switch", "beta")
            cli(host, "switch", "alpha")  # beta asleep: both one wake away
            base = url(host)

            before = proxy_state(host)
            warm = Client(base, ["beta", "alpha"], rounds=args.rounds)
            warm.__enter__()
            warm.join(600)
            raw["warm"] = [asdict(a) for a in warm.answers]
            if args.calls:
                args.calls.write_text(host.run(f"cat {calls_log}").stdout)
            after = proxy_state(host)  # HAProxy's own count: how many of the warm swaps reloaded it
            raw["warm_proxy"] = {
                "reloads": after.reloads - before.reloads
                if after.reloads is not None and before.reloads is not None
                else None,
                "file_matches_running": after.file_matches_running,
            }
            awake = str(warm.answers[-1].model) if warm.answers else "alpha"
            for n in (1, 2, 16):  # what a request of n tokens takes on an awake engine (median of 5)
                took = [first_token(host.address, AB[awake]["port"], awake, n) for _ in range(5)]
                raw[f"service_{n}_s"] = statistics.median([f for f in took if f is not None] or [0.0])
            raw["first_token_s"] = raw["service_1_s"]

            cold: list[Answer] = []
            for _ in range(args.cold_rounds):
                one = Client(base, ["gamma"], rounds=1)
                one.__enter__()
                one.join(120)
                cold += one.answers
                cli(host, "stop", "gamma")
            raw["cold"] = [asdict(a) for a in cold]

            mixed = [Client(base, ["alpha", "beta"], max_tokens=16), Client(base, ["beta", "alpha"], max_tokens=16)]
            raw["mixed_s"] = timed(mixed, args.seconds)
            cli(host, "switch", "alpha")
            only = [Client(base, ["alpha"], max_tokens=16), Client(base, ["alpha"], max_tokens=16)]
            raw["only_s"] = timed(only, args.seconds)
            raw["mixed"] = [asdict(a) for c in mixed for a in c.answers]
            raw["only_a"] = [asdict(a) for c in only for a in c.answers]
            demand = [
                d
                for d in json.loads(cli(host, "history", "--json", "--limit", "200").stdout)
                if str(d.get("trigger", "")).startswith("demand:")
            ]
            raw["demand_deployments"] = [
                {k: d.get(k) for k in ("id", "model", "outcome", "created_at", "ended_at", "demand", "phases")}
                for d in demand
            ]
            raw["engine_lines"] = [vars(x) for x in engine_lines(host, [f"vllm-{m}.service" for m in AB])]
            raw["load_after"] = os.getloadavg()  # this 2-core machine is shared: the figures move with it
            host.run(
                "systemctl stop orchestrator-agent.service orchestrator-proxy.service; systemctl stop 'vllm-*'",
                check=False,
            )
    finally:
        hosts.close()
    args.raw.write_text(json.dumps(raw, indent=1))
    report(raw)
    if args.profile_out:
        args.profile_out.write_text(profile(raw))


def profile(raw: dict[str, Any]) -> str:
    """Where each warm request's wait went, from the agent's own timeline of its swap (history's demand row:
    the oldest held request's arrival, the decision, every progress event of the switch, the release of the
    held requests, the swap's end; ms from the arrival), the client's answer beside it; then the median of
    each step (from one mark to the next) across the swaps."""
    swaps = raw["demand_deployments"]
    out = [
        "Warm on-demand swaps, one client alternating beta/alpha (bench/on_demand.py, raw bench/on_demand.json):",
        "ms from the held request's arrival at the agent (its oldest ticket) to each mark the agent recorded;",
        "'answer' is the client's whole wait (it sent the request a few ms before the agent saw it).",
        "",
    ]
    steps: dict[str, list[int]] = {}
    order: list[str] = []
    for a in [Answer(**x) for x in raw["warm"] if x["status"] == 200]:
        swap = next((d for d in swaps if d["model"] == a.model and a.w0 <= d["created_at"] <= a.w1), None)
        marks = ((swap or {}).get("demand") or {}).get("timeline_ms") or []
        if not marks:
            continue
        out.append(f"-> {a.model}: " + ", ".join(f"{what} {t}" for t, what in marks) + f", answer {ms(a.wait)}")
        other = next((m for m in ("alpha", "beta") if m != a.model), "")
        named = [
            (t, " ".join("target" if w == a.model else "displaced" if w == other else w for w in what.split()))
            for t, what in marks
        ]
        for (t0, w0), (t1, w1) in zip(named, [*named[1:], (round(1000 * a.wait), "answer")]):
            key = f"{w0} -> {w1}"
            if key not in steps:
                order.append(key)
            steps.setdefault(key, []).append(t1 - t0)
    out += ["", "median ms per step (n swaps), in the order first seen:"]
    for key in order:
        vals = steps[key]
        out.append(f"  {statistics.median(vals):7.0f}  ({len(vals):2d})  {key}")
    return "\n".join(out) + "\n"


PEAK_S = 1.5  # orchestrator/agent/demand_view.py: a model counts as in flight for the most HAProxy saw over this long


def first_marks(swap: dict[str, Any]) -> dict[str, float]:
    """The agent's marks of a swap (seconds from the arrival), by their first word, each at its first
    occurrence ("phase" is the first phase)."""
    marks: dict[str, float] = {}
    for t, what in (swap.get("demand") or {}).get("timeline_ms") or []:
        marks.setdefault(what.split()[0], t / 1000)
    return marks


def decided_at(swap: dict[str, Any]) -> float:
    """When the agent decided the swap (wall clock): its record's creation less the agent's own time
    from the decision to the first phase (the record is made in between: this errs early, so the cap's
    wait it implies errs short)."""
    marks = first_marks(swap)
    lead = marks["phase"] - marks["decided"] if "phase" in marks and "decided" in marks else 0.0
    return float(swap["created_at"]) - lead


def against_floor(
    answers: list[Answer],
    lines: list[Line],
    service: dict[int, float],
    batch_wait_s: float,
    swaps: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each answered request: its wait, the floor of the swap inside it, the batching bound (strict: another
    model had a request in flight as it arrived; as the agent counts: or answered one within PEAK_S before),
    the excess over the strict bound, and where its wait went (arrival -> the swap's record -> its end ->
    the answer, with the swap's phases)."""
    rows = []
    for a in answers:
        steps = engine_steps(lines, a.w0, a.w1)
        woke = steps["woke"] == f"vllm-{a.model}.service"
        sleep = steps["sleep_s"] if woke and steps["slept"] != steps["woke"] else None
        floor = (sleep or 0.0) + (steps["wake_s"] if woke else 0.0) + service[a.tokens]
        others = [b for b in answers if b is not a and b.model != a.model]

        def busy_at(r: Answer, others: list[Answer] = others) -> bool:
            return any(b.w0 <= r.w0 < b.w1 for b in others)

        busy = busy_at(a)
        recent = busy or any(b.w0 <= a.w0 < b.w1 + PEAK_S for b in others)
        # The batching bound: a request arriving while another model serves waits up to batch_wait_s;
        # one that joins requests for its model already held that long waits until their bound.
        held = [b for b in answers if b.model == a.model and b.w0 <= a.w0 < b.w1 and busy_at(b)]
        bound = max([0.0, *(b.w0 + batch_wait_s - a.w0 for b in held)])
        # the swap cap's wait: the previous swap was decided less than its spacing before this request came
        before = [decided_at(d) for d in swaps if decided_at(d) < a.w0]
        cap = max(0.0, max(before) + 60 / MAX_SWAPS_PER_MIN - a.w0) if before else 0.0
        swap = next((d for d in swaps if d["model"] == a.model and a.w0 <= d["created_at"] <= a.w1), None)
        split: dict[str, Any] = {}
        if swap is not None and swap.get("ended_at") is not None:
            phases = {p["phase"]: p["seconds"] for p in swap.get("phases") or [] if p.get("seconds") is not None}
            split = {
                "arrival_to_swap": swap["created_at"] - a.w0,
                "swap": swap["ended_at"] - swap["created_at"],
                "before_route": sum(phases.get(k, 0.0) for k in ("planned", "preflight", "staging")),
                "swap_to_answer": a.w1 - swap["ended_at"],
                "phases": phases,
            }
            marks = first_marks(swap)
            if "decided" in marks and "released" in marks:  # the agent's own marks (ms from the arrival)
                split.update(
                    arrival_to_swap=marks["decided"],
                    swap=marks["released"] - marks["decided"],
                    swap_to_answer=a.wait - marks["released"],
                )
        rows.append(
            {
                "model": a.model,
                "status": a.status,
                "wait_s": a.wait,
                "swap": woke,
                "sleep_s": sleep,
                "wake_s": steps["wake_s"] if woke else None,
                "floor_s": floor,
                "bound_s": bound,
                "agent_bound_s": batch_wait_s if recent else 0.0,
                "excess_s": a.wait - floor - bound,
                "cap_s": cap if woke else 0.0,
                # over the floor once the bounds the operator set (batch_wait_s, max_swaps_per_min) are met
                "bounded_excess_s": a.wait - floor - max(bound, cap if woke else 0.0),
                "drain_s": steps["drain_s"] if woke else None,
                "split_s": split,
            }
        )
    return rows


def report(raw: dict[str, Any]) -> None:
    """The summary (stdout) from the raw answers."""

    def answers(key: str) -> list[Answer]:
        return [Answer(**a) for a in raw[key]]

    warm, cold, mixed, only = answers("warm"), answers("cold"), answers("mixed"), answers("only_a")
    lines = [Line(**x) for x in raw["engine_lines"]]
    first, bw = float(raw["first_token_s"]), float(raw["batch_wait_s"])
    # what the request itself takes on an awake engine: measured, or (an older raw file) the first token
    # and the stand-in's 20 ms for each further token
    service = {n: float(raw.get(f"service_{n}_s", first + 0.02 * (n - 1))) for n in (1, 2, 16)}
    la, lb = raw.get("load_before") or [0.0], raw.get("load_after") or [0.0]
    print(
        f"stand-in: load 2 s, sleep 0.1 s, wake 0.3 s, 20 ms a token; batch_wait_s {bw:g}; first token "
        f"{ms(first)} ms, a 2-token request {ms(service[2])} ms, a 16-token one {ms(service[16])} ms (on an awake "
        f"engine's port: the floor's last part); load average before {la[0]:.1f}, after {lb[0]:.1f}"
    )
    print("warm: one client alternating beta/alpha, every request waits for a swap")
    print(
        "  #  model  wait_ms sleep_ms wake_ms floor_ms bound_ms excess_ms agent_bound_ms drain_ms cap_ms | "
        "arrival->swap swap (preflight+staging) swap->answer (swap: its decision to its release of the held "
        "requests, or to its end)"
    )
    swaps = raw["demand_deployments"]
    warm_rows = against_floor([a for a in warm if a.status == 200], lines, service, bw, swaps)
    for i, r in enumerate(warm_rows):
        sp = r["split_s"]
        print(
            f"{i + 1:3d}  {r['model']:6s} {ms(r['wait_s']):>7s} {ms(r['sleep_s']):>8s} {ms(r['wake_s']):>7s} "
            f"{ms(r['floor_s']):>8s} {ms(r['bound_s']):>8s} {ms(r['excess_s']):>9s} {ms(r['agent_bound_s']):>14s} "
            f"{ms(r['drain_s']):>8s} {ms(r.get('cap_s')):>6s} | {ms(sp.get('arrival_to_swap')):>13s} "
            f"{ms(sp.get('swap')):>4s} ({ms(sp.get('before_route'))}) {ms(sp.get('swap_to_answer')):>17s}"
        )
    mixed_rows = against_floor([a for a in mixed if a.status == 200], lines, service, bw, swaps)
    verdicts = []
    for name, rows, failed in (
        ("warm", warm_rows, sum(a.failed for a in warm)),
        ("mixed", mixed_rows, sum(a.failed for a in mixed)),
    ):
        swaps = [r for r in rows if r["swap"]]
        ex = [r["excess_s"] for r in rows]
        if not ex:
            print(f"{name}: no answered request")
            verdicts.append(False)
            continue
        med, worst = statistics.median(ex), max(ex)
        bounded = [r["bounded_excess_s"] for r in rows]
        print(
            f"{name}: {len(rows)} answered ({len(swaps)} waited for a swap, {sum(r['bound_s'] > 0 for r in rows)} "
            f"behind a busy model), failed {failed}; wait median {ms(statistics.median(r['wait_s'] for r in rows))}"
            f" ms, max {ms(max(r['wait_s'] for r in rows))} ms; floor median "
            f"{ms(statistics.median(r['floor_s'] for r in rows))} ms; wait - floor - bound: median {ms(med)} ms, "
            f"max {ms(worst)} ms; less the drain: median "
            f"{ms(statistics.median(r['excess_s'] - (r['drain_s'] or 0) for r in rows))} ms; against the bound "
            f"as the agent counts it (busy for {PEAK_S:g} s after a request): median "
            f"{ms(statistics.median(r['excess_s'] + r['bound_s'] - r['agent_bound_s'] for r in rows))} ms; "
            f"less the swap cap's wait too (max_swaps_per_min {MAX_SWAPS_PER_MIN}: swaps "
            f"{60 / MAX_SWAPS_PER_MIN:g} s apart): median "
            f"{ms(statistics.median(r['excess_s'] - max(0.0, r.get('cap_s', 0.0) - r['bound_s']) for r in rows))}"
            f" ms, max {ms(max(r['excess_s'] - max(0.0, r.get('cap_s', 0.0) - r['bound_s']) for r in rows))} ms"
        )
        own = [
            r["split_s"]["swap"] - (r["sleep_s"] or 0.0) - (r["wake_s"] or 0.0)
            for r in swaps
            if r["split_s"] and r["wake_s"] is not None
        ]
        if own:
            print(
                f"  the swap's own part (its decision to its release, less the engines' sleep and wake): median "
                f"{ms(statistics.median(own))} ms, max {ms(max(own))} ms"
            )
        for key in ("arrival_to_swap", "swap", "before_route", "swap_to_answer"):
            vals = [r["split_s"][key] for r in swaps if r["split_s"]]
            if vals:
                print(f"  {key}: median {ms(statistics.median(vals))} ms, max {ms(max(vals))} ms")
        print(
            f"  over the floor once the operator's bounds are met (batch_wait_s {bw:g} s where it applies, "
            f"the swap cap's spacing): median {ms(statistics.median(bounded))} ms, max {ms(max(bounded))} ms"
        )
        verdicts.append(statistics.median(bounded) <= 0.1 and max(bounded) < 0.3 and failed == 0)
    summary: dict[str, Any] = {
        "warm_swap_wait": spread([a.wait for a in warm if a.status == 200]),
        "cold_start_wait": spread([a.wait for a in cold if a.status == 200]),
        "cold_failed": sum(a.failed for a in cold),
        "mixed_a_b": {**throughput(mixed, raw["mixed_s"]), "429": sum(a.status == 429 for a in mixed)},
        "only_a": throughput(only, raw["only_s"]),
        "demand_swaps": len(raw["demand_deployments"]),
    }
    if "warm_proxy" in raw:  # runs before the count was kept have none
        summary["warm_proxy"] = raw["warm_proxy"]
    for key, value in summary.items():
        print(f"{key}: {value}", flush=True)
    mixed_tok, only_tok = summary["mixed_a_b"]["tok_s"], summary["only_a"]["tok_s"]
    print(
        f"mixed A/B serves {mixed_tok} tok/s, {100 * mixed_tok / max(only_tok, 1e-9):.0f}% of a box serving "
        f"only A ({only_tok} tok/s)",
        flush=True,
    )
    print(
        f"{'PASS' if all(verdicts) else 'FAIL'}: wait <= floor + max(batching bound, swap cap's wait) + 0.1 s at "
        "the median, max under + 0.3 s, 0 failed (warm, mixed)"
    )


if __name__ == "__main__":
    main()
