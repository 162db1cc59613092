#!/usr/bin/env python3
"""Downtime of a model switch, measured from outside, for the orchestrator, Ansible and bash.

Boots one systemd test host, runs the stand-in engine (fixed load time L, stop time S) under
systemd there, and switches A -> B -> A ... in rounds of one switch per tool while a prober asks
both models' ports for a completion every 50 ms. Downtime = A's last good answer to B's first good answer;
overhead = downtime - (S + L). Then: switches to models whose weights must first be staged
from the local hub stand-in (two sizes), and the agent's own CPU and memory, idle and switching.
Prints a table and writes bench/RESULTS.md.

    .venv/bin/python bench/downtime/switch_downtime.py [--switches 6] [--load-time 2] [--stop-time 1]
        [--sizes-gb 1,3] [--skip-staging] [--skip-agent] [--skip-local] [--skip-ansible]
        [--idle-seconds 31] [--output bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.downtime import methods, report
from bench.downtime.footprint import Sampler, Window
from bench.downtime.probe import Prober, Target
from bench.downtime.report import Trial
from bench.downtime.setup import Bench, BenchModel, Timing

Switcher = Callable[[Bench, BenchModel, BenchModel], tuple[float, dict[str, float]]]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def targets(bench: Bench, *models: BenchModel) -> list[Target]:
    return [Target(bench.host.address, m.port, m.name) for m in models]


def measure(
    bench: Bench, prober: Prober, method: str, fn: Switcher, old: BenchModel, new: BenchModel, note: str = ""
) -> Trial:
    prober.wait_serving()
    time.sleep(0.3)  # a few good answers from A before the switch starts
    t0 = time.monotonic()
    wall, phases = fn(bench, old, new)
    prober.wait_serving()
    gap, _, _ = prober.downtime(t0, time.monotonic())
    trial = Trial(method, old.name, new.name, gap, wall, bench.timing.stop_s + bench.timing.load_s, note, phases)
    log(
        f"{method:12s} {old.name} -> {new.name}: downtime {gap:.3f} s, overhead {trial.overhead:+.3f} s, "
        f"command {wall:.2f} s {note}"
    )
    return trial


def interleaved(
    bench: Bench, tools: dict[str, Switcher], a: BenchModel, b: BenchModel, rounds: int, serving: BenchModel
) -> tuple[dict[str, list[Trial]], BenchModel]:
    """``rounds`` rounds of one switch per tool, each to the model not serving: on a shared machine
    the load drifts, so every tool is measured in every stretch of the run. Odd rounds go through
    the tools in reverse order, so each tool alternates A -> B and B -> A."""
    trials: dict[str, list[Trial]] = {name: [] for name in tools}
    with Prober(targets(bench, a, b)) as prober:
        for r in range(rounds):
            for name, fn in list(tools.items())[:: -1 if r % 2 else 1]:
                new = b if serving is a else a
                trials[name].append(measure(bench, prober, name, fn, serving, new))
                serving = new
    return trials, serving


def staging_trials(
    bench: Bench, a: BenchModel, groups: list[tuple[float, list[BenchModel]]], serving: BenchModel, back_name: str
) -> tuple[list[Trial], list[Trial], BenchModel]:
    """Per size: A -> a fresh model (staged inside the switch), back to A, A -> a second fresh model, back.

    The switches back to A (weights present, same catalog) are the baseline the staged ones compare to.
    """
    staged: list[Trial] = []
    back: list[Trial] = []
    for size, bigs in groups:
        watched = list(dict.fromkeys([a, serving, *bigs]))
        with Prober(targets(bench, *watched)) as prober:
            if serving is not a:
                back.append(measure(bench, prober, back_name, methods.orchestrator_switch, serving, a))
                serving = a
            for big in bigs:
                staged.append(
                    measure(bench, prober, "staged", methods.orchestrator_switch, a, big, note=f"{size:g} GB staged")
                )
                back.append(measure(bench, prober, back_name, methods.orchestrator_switch, big, a))
    return staged, back, a


def agent_footprint(
    bench: Bench, a: BenchModel, b: BenchModel, serving: BenchModel, idle_s: float
) -> tuple[dict[str, Window], list[Trial], BenchModel]:
    config = bench.work / "deploy.toml"
    sock = bench.work / "state" / "agent.sock"
    out = open(bench.work / "agent.log", "wb")  # noqa: SIM115 - handed to the child
    agent = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "agent", "--config", str(config), "--metrics-port", "0"],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    out.close()
    windows: dict[str, Window] = {}
    trials: list[Trial] = []
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent did not open {sock}:\n{(bench.work / 'agent.log').read_text()[-3000:]}")
            time.sleep(0.05)
        time.sleep(2.0)  # let start-up (imports, first health watch) settle before measuring idle
        with Sampler(agent.pid) as idle:
            time.sleep(idle_s)
        windows["idle"] = idle.window
        with Prober(targets(bench, a, b)) as prober:
            for i in range(2):
                new = b if serving is a else a
                with Sampler(agent.pid) as s:
                    trials.append(measure(bench, prober, "via agent", methods.orchestrator_switch, serving, new))
                windows[f"switch {i + 1}"] = s.window
                serving = new
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    return windows, trials, serving


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--switches", type=int, default=6, help="measured switches per tool (rounds of one per tool)")
    p.add_argument("--load-time", type=float, default=2.0, help="stand-in load time L, seconds")
    p.add_argument("--stop-time", type=float, default=1.0, help="stand-in stop time S, seconds")
    p.add_argument("--sizes-gb", default="1,3", help="weight sizes for the staged switches, GB (10^9 bytes)")
    p.add_argument("--skip-staging", action="store_true")
    p.add_argument("--skip-agent", action="store_true")
    p.add_argument("--skip-ansible", action="store_true")
    p.add_argument("--skip-local", action="store_true", help="skip the orchestrator run on the host (D-Bus)")
    p.add_argument("--idle-seconds", type=float, default=31.0, help="agent idle window (>= 2 health-watch ticks)")
    p.add_argument("--output", default=str(ROOT / "bench" / "RESULTS.md"))
    args = p.parse_args()
    if args.switches < 1:
        p.error("--switches must be at least 1")
    sizes = [] if args.skip_staging else [float(s) for s in args.sizes_gb.split(",") if s.strip()]

    from bench.downtime.staging import add_repo
    from tests.hosts.pool import boot_hosts
    from tests.hubstub import HubStub

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="switch-downtime-"))
    models_dir = Path(tempfile.mkdtemp(prefix="switch-downtime-models-", dir="/var/tmp"))
    timing = Timing(load_s=args.load_time, stop_s=args.stop_time)
    results = report.Results(args=sys.argv[1:], timing=timing, sizes_gb=sizes, load_before=report.load_now())
    try:
        with HubStub() as hub, contextlib.closing(boot_hosts(1, binds_rw=(f"{models_dir}:/models",))) as hs:
            os.environ["HF_ENDPOINT"] = hub.url  # the CLI passes it to the stage worker on the host
            host = hs.hosts[0]
            log(f"host {host.name} at {host.address} booted in {host.boot_seconds:.1f} s; hub at {hub.url}")
            # Unit names unique to this host's address slot: test hosts on one machine share the unified
            # cgroup tree, so a same-named unit on another session's host would collide with ours.
            slot = host.address.rsplit(".", 1)[1]
            a, b = BenchModel(f"alpha-{slot}", 8201), BenchModel(f"beta-{slot}", 8202)
            bench = Bench(host, work, timing, [a, b])
            groups: list[tuple[float, list[BenchModel]]] = []
            for i, size in enumerate(sizes):
                groups.append((size, []))
                for j in range(2):
                    name = f"big{i + 1}-{j + 1}-{slot}"
                    sha = f"{i:02x}{j:02x}".ljust(40, "f")
                    add_repo(hub, f"bench/{name}", int(size * 1e9), sha)
                    groups[-1][1].append(BenchModel(name, 8210 + 2 * i + j, repo=f"bench/{name}", revision=sha))
            bench.deploy_toml()  # A and B only; the staged models join the catalog for their part
            methods.write_inventory(bench)
            results.commands = report.example_commands(bench, a, b)

            log("orchestrator: first deploy of alpha (not measured)")
            methods.orchestrator_switch(bench, b, a)
            serving = a
            tools: dict[str, Switcher] = {"orchestrator": methods.orchestrator_switch}
            if not args.skip_local:
                tools["orchestrator-local"] = methods.local_switch
            if not args.skip_ansible:
                tools["ansible"] = methods.ansible_switch
            tools["bash"] = methods.bash_switch
            found, serving = interleaved(bench, tools, a, b, args.switches, serving)
            results.trials.update(found)
            if sizes:
                bench.models = [a, b, *(m for _, bigs in groups for m in bigs)]
                bench.deploy_toml()
                results.baseline = f"orchestrator, {len(bench.models)} models"
                results.trials["staged"], results.trials[results.baseline], serving = staging_trials(
                    bench, a, groups, serving, results.baseline
                )
                bench.models = [a, b]
                bench.deploy_toml()
            if not args.skip_agent:
                results.agent, results.trials["via agent"], serving = agent_footprint(
                    bench, a, b, serving, args.idle_seconds
                )
    finally:
        shutil.rmtree(models_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results.elapsed_s = time.time() - started
    results.load_after = report.load_now()
    text = report.render(results)
    print(report.table(results))
    out = Path(args.output)
    out.write_text(report.merge(out.read_text() if out.exists() else "", text))
    log(f"wrote {args.output} ({results.elapsed_s:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
