#!/usr/bin/env python3
"""How fast can the load generator go? Starts the stand-in server streaming instantly and prints the
sustained streamed output tokens/s at each concurrency (target: >= 10,000 tok/s at C=256 on 2 cores).

    .venv/bin/python bench/loadgen/loadgen.py [--concurrency 256] [--duration 20 | --requests N] [--max-tokens 512]
        [--client aiohttp|httpx] [--profile FILE]   # cProfile of the generator process
    .venv/bin/python bench/loadgen/loadgen.py --url http://127.0.0.1:8000 ...   # measure a real server instead
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.loadgen import BenchPlan, BenchTarget, Progress, run_bench_blocking

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "standin" / "openai_server.py"


def start_server(batch: int, delay: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--port",
            "0",
            "--served-name",
            "bench",
            "--stream-batch",
            str(batch),
            "--chunk-delay",
            str(delay),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if " listening on " not in line:
        proc.kill()
        raise SystemExit(f"stand-in server did not start: {line!r}")
    return proc, int(line.split(" listening on ")[1].split()[0].rsplit(":", 1)[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime in clock ticks (USER_HZ=100)


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (to see how much other work ran alongside)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / 100.0  # minus idle and iowait


def show(p: Progress) -> None:
    print(
        f"\r  C={p.concurrency:<4} {p.elapsed_s:5.1f}s  ok={p.requests_ok:<6} failed={p.requests_failed:<4}"
        f" in-flight={p.in_flight:<4} streamed {p.streamed_tok_s:9.0f} tok/s",
        end="",
        file=sys.stderr,
    )
    if p.done:
        print(file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="256")
    ap.add_argument("--duration", type=float, default=None, help="seconds per level (default 20)")
    ap.add_argument("--requests", type=int, default=None, help="requests per level instead of --duration")
    ap.add_argument("--url", default=None, help="bench this server instead of starting the stand-in")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument(
        "--stream-batch", type=int, default=1, help="tokens per server write (1 = one HTTP chunk per token, like vLLM)"
    )
    ap.add_argument("--chunk-delay", type=float, default=0.0, help="server seconds per token (0 = instant)")
    ap.add_argument(
        "--client",
        choices=["aiohttp", "httpx"],
        default=None,
        help="HTTP client of the generator (default: aiohttp if installed)",
    )
    ap.add_argument("--json", action="store_true", help="print the whole result as JSON")
    ap.add_argument("--profile", default=None)
    args = ap.parse_args()
    if args.url:
        proc, target = None, BenchTarget(args.url, endpoint=args.endpoint)
    else:
        proc, port = start_server(args.stream_batch, args.chunk_delay)
        target = BenchTarget(f"http://127.0.0.1:{port}", endpoint=args.endpoint)
    try:
        plan = BenchPlan(
            concurrency=tuple(int(c) for c in args.concurrency.split(",")),
            max_tokens=args.max_tokens,
            prompt_tokens=args.prompt_tokens,
            duration_s=args.duration if args.duration or args.requests else 20.0,
            requests=args.requests,
        )
        server_pid = proc.pid if proc else os.getpid()
        server_cpu0, busy0, t0 = cpu_seconds(server_pid), machine_busy_seconds(), time.monotonic()
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        profiler = cProfile.Profile() if args.profile else None
        if profiler:
            profiler.enable()
        result = run_bench_blocking(target, plan, on_progress=show, client=args.client)
        if profiler:
            profiler.disable()
            profiler.dump_stats(args.profile)
            pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
        wall = time.monotonic() - t0
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        server_cpu = cpu_seconds(server_pid) - server_cpu0 if proc else 0.0
        busy = machine_busy_seconds() - busy0
    finally:
        if proc:
            proc.terminate()
            proc.wait(10)
    own_cpu = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    others = max(0.0, busy - own_cpu - server_cpu)
    server = f"stand-in server {server_cpu:.1f}s ({server_cpu / wall:.0%}), " if proc else ""
    print(
        f"client {result.client}; cpu over {wall:.1f}s wall on {os.cpu_count()} cores: generator "
        f"{own_cpu:.1f}s ({own_cpu / wall:.0%} of a core), {server}other processes {others:.1f}s"
    )
    for lv in result.levels:
        errors = ", ".join(f"{e.kind}={e.count}" for e in lv.errors) or "none"
        print(
            f"C={lv.concurrency}: {lv.output_tok_s:,.0f} output tok/s sustained "
            f"({lv.output_tokens:,} tokens from usage in {lv.duration_s:.1f}s), "
            f"{lv.requests_per_s:.1f} req/s, "
            f"per stream {lv.output_tok_s_per_stream:,.0f} tok/s, TTFT p50 {lv.ttft_ms.p50:.1f} ms "
            f"p99 {lv.ttft_ms.p99:.1f} ms, ITL p50 {lv.itl_ms.p50:.2f} ms p99 {lv.itl_ms.p99:.2f} ms, "
            f"errors: {errors}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
