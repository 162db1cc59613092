#!/usr/bin/env python3
"""Switch overhead through `--host ssh://` (relay + the box's agent) beside in-process, against a floor.

Boots one systemd test host in a network namespace of its own (traffic crosses a bridge), puts the
agent on it with `orchestrator agent install` (this tree's wheel, its own venv), and switches the
stand-in engine (load time L, stop time S) A -> B -> A ... in rounds of one switch per tool while a
prober asks both ports for a completion every 50 ms (bench/downtime: downtime = longest gap,
overhead = downtime - (S + L)). Tools:

- floor: bench/baselines/floor/switch.sh, ONE persistent SSH connection (ControlMaster) running stop + write
  unit + daemon-reload + start as one command, then a 50 ms /health poll, no checks at all;
- orchestrator: the CLI here in-process, ssh transport (fabric), every safety step; --ignore-agent
  since the box's agent runs (its watch is slowed to once an hour so it does not act on the others);
- via --host: `orchestrator --host ssh://root@box switch B`: the relay on the box, its agent, D-Bus;
- bash (optional): bench/baselines/bash/switch.sh, one ssh call per step and 1 s polls.

Every tool is reported as a ratio of its median overhead to the floor's. Writes bench/remote/REMOTE.md and
the raw per-switch lines to bench/remote/remote_overhead.txt; also times what a --host command pays
before the switch starts (CLI start-up, SSH connect, relay start) for the profile.

    .venv/bin/python bench/remote/remote_overhead.py [--switches 6] [--load-time 2] [--stop-time 1] [--skip-bash]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.downtime import methods, report
from bench.downtime.report import Trial, median
from bench.downtime.setup import Bench, BenchModel, Timing
from bench.downtime.switch_downtime import interleaved, log

FLOOR_SCRIPT = ROOT / "bench" / "baselines" / "floor" / "switch.sh"
PY = sys.executable


def hosts_file(bench: Bench) -> Path:
    h = bench.host
    path = bench.work / "hosts.toml"
    path.write_text(
        f'[box]\nurl = "ssh://root@{h.address}:{h.port}"\nkey = "{h.key_path}"\nknown_hosts = "{h.known_hosts_path}"\n'
    )
    return path


def install_agent(bench: Bench) -> float:
    """`orchestrator agent install` with the box's own deploy.toml (local transport, slow watch)."""
    h = bench.host
    cfg = bench.work / "box.toml"
    cfg.write_text(bench.deploy_text(local=True) + "[policy]\nwatch_interval_s = 3600\n")
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            PY,
            "-m",
            "orchestrator",
            "agent",
            "install",
            f"ssh://root@{h.address}:{h.port}",
            "--key",
            str(h.key_path),
            "--known-hosts",
            str(h.known_hosts_path),
            "--config",
            str(cfg),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"agent install failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return time.monotonic() - t0


def remote_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, dict[str, float]]:
    env = {**os.environ, "ORCHESTRATOR_HOSTS_FILE": str(bench.work / "hosts.toml")}
    argv = [PY, "-m", "orchestrator", "--host", "box", "switch", new.name, "--json"]
    with _env(env):
        return methods._orchestrator(argv)


def inprocess_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, dict[str, float]]:
    return methods._orchestrator([*methods.orchestrator_command(bench, new), "--ignore-agent"])


@contextlib.contextmanager
def _env(env: dict[str, str]):  # type: ignore[no-untyped-def]
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def control_master(bench: Bench) -> tuple[Path, list[str]]:
    """Open the floor's one persistent SSH connection (it stays open for the whole run)."""
    path = bench.work / "cm.sock"
    argv = bench.host.ssh_argv()
    subprocess.run(
        [argv[0], "-M", "-S", str(path), "-o", "ControlPersist=yes", "-fN", *argv[1:]], check=True, timeout=30
    )
    return path, argv


def floor_switch_factory(control: Path):  # type: ignore[no-untyped-def]
    def floor_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, dict[str, float]]:
        h = bench.host
        ssh_opts = " ".join(h.ssh_argv()[1:-1])
        env = {
            "TARGET": f"{h.user}@{h.address}",
            "CONTROL_PATH": str(control),
            "OLD_UNIT": old.unit,
            "NEW_UNIT": new.unit,
            "UNIT_TEXT": bench.unit_text(new),
            "HEALTH_URL": f"http://{h.address}:{new.port}/health",
            "SSH_OPTS": ssh_opts,
        }
        return methods._run(["bash", str(FLOOR_SCRIPT)], env)

    return floor_switch


def timed(argv: list[str], env: dict[str, str] | None = None, repeats: int = 5) -> float:
    """Median wall seconds of a command (what a --host command pays before the switch starts)."""
    walls = []
    for _ in range(repeats):
        t0 = time.monotonic()
        subprocess.run(argv, capture_output=True, check=True, timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})
        walls.append(time.monotonic() - t0)
    return median(walls)


def profile(bench: Bench) -> dict[str, float]:
    h = bench.host
    env = {"ORCHESTRATOR_HOSTS_FILE": str(bench.work / "hosts.toml")}
    ssh = h.ssh_argv()
    return {
        "python -c pass (interpreter start)": timed([PY, "-c", "pass"]),
        "orchestrator --help (CLI imports)": timed([PY, "-m", "orchestrator", "--help"]),
        "orchestrator --host box history (CLI + paramiko connect + relay + agent)": timed(
            [PY, "-m", "orchestrator", "--host", "box", "history", "--limit", "1"], env
        ),
        "ssh box true (OpenSSH connect + exec)": timed([*ssh, "--", "true"]),
        "ssh box relay start (box venv python -m orchestrator.agent.relay < /dev/null)": timed(
            [
                *ssh,
                "--",
                (
                    "/opt/orchestrator/venv/bin/python -m orchestrator.agent.relay "
                    "--config /etc/orchestrator/deploy.toml < /dev/null"
                ),
            ]
        ),
    }


def render(
    results: dict[str, list[Trial]],
    timing: Timing,
    prof: dict[str, float],
    install_s: float,
    args: list[str],
    elapsed: float,
    load: tuple[str, str],
) -> str:
    floor = median([t.overhead for t in results["floor"]])
    rows = []
    for method, trials in results.items():
        over = median([t.overhead for t in trials])
        rows.append(
            [
                method,
                str(len(trials)),
                f"{median([t.downtime_s for t in trials]):.3f}",
                f"{min(t.downtime_s for t in trials):.3f}-{max(t.downtime_s for t in trials):.3f}",
                f"{over:.3f}",
                f"{over / floor:.2f}x" if floor > 0 else "n/a",
                f"{median([t.command_s for t in trials]):.2f}",
            ]
        )
    head = [
        "method",
        "switches",
        "downtime median s",
        "min-max s",
        "overhead median s",
        "overhead / floor",
        "command median s",
    ]
    ours, remote = (median([t.overhead for t in results[m]]) for m in ("orchestrator", "via --host"))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Switch overhead through `--host ssh://` (relay + the box's agent), in-process, and the floor",
        "",
        (
            f"Written by `bench/remote/remote_overhead.py` on {now} ({elapsed:.0f} s run); raw lines: "
            f"`bench/remote/remote_overhead.txt`. Re-run: `.venv/bin/python bench/remote/remote_overhead.py "
            f"{' '.join(map(shlex.quote, args))}`."
        ),
        "",
        *report._machine(
            report.Results(args=args, timing=timing, sizes_gb=[], load_before=(load[0], 0.0), load_after=(load[1], 0.0))
        )[:2],
        f"- machine load average {load[0]} at start, {load[1]} at the end (other sessions share the 2 cores)",
        (
            "- test host: systemd-nspawn container in a network namespace of its own behind a bridge (traffic to it "
            f"crosses a veth pair); agent put there by `orchestrator agent install` ({install_s:.0f} s, first install "
            "with the wheel cache warm)"
        ),
        "",
        "## Method",
        "",
        (
            f"- Stand-in engine: L = {timing.load_s:g} s, S = {timing.stop_s:g} s; prober every 50 ms from this "
            "machine; downtime = longest gap between good answers; overhead = downtime - (S + L) "
            "(bench/downtime/README.md)."
        ),
        "- Rounds of one switch per tool, each to the model not serving; every tool writes the same unit text.",
        (
            "- `floor`: bench/baselines/floor/switch.sh: ONE persistent SSH connection (ControlMaster, opened "
            "before the run) doing `systemctl stop A && cat > unit && systemctl daemon-reload && systemctl start B` "
            "as one command, "
            "then curl /health every 50 ms. No GPU-free wait, no readiness beyond /health, no record, no rollback."
        ),
        (
            "- `orchestrator`: the CLI here, in-process, ssh transport (fabric, one connection), every safety step "
            "(preflight, stop, GPUs free, install, start, /health + /v1/models + one real completion polled every "
            "0.2 s, record), with --ignore-agent because the box's agent runs."
        ),
        (
            "- `via --host`: `orchestrator --host ssh://root@box switch B`: paramiko to the box, the relay "
            "(`python -m orchestrator.agent.relay`), the agent there running the same steps over D-Bus."
        ),
        "- `bash`: bench/baselines/bash/switch.sh (one ssh per step, 1 s polls), as in bench/RESULTS.md.",
        "",
        "## Downtime and overhead",
        "",
        report._md(head, rows),
        "",
        f"- relay path vs in-process: {remote - ours:+.3f} s of overhead (goal: at most +0.1 s)",
        f"- ours over the floor: in-process {ours / floor:.2f}x, via --host {remote / floor:.2f}x (goal: at most 1.3x)"
        if floor > 0
        else "- floor overhead not positive: no ratio",
        "",
        "## Phases as each recorded them (median s)",
        "",
        (
            "The downtime spans the end of `stopping` (S), `freeing`, `installing`, `starting` and the engine's load "
            "inside `checking` (L). In-process runs them here over SSH; via --host the agent runs them on the box "
            "over D-Bus."
        ),
        "",
        report._md(
            ["phase", *(f"{m} median s" for m in ("orchestrator", "via --host"))],
            [
                [
                    p,
                    *(
                        f"{median([t.phases.get(p, 0.0) for t in results[m]]):.3f}"
                        for m in ("orchestrator", "via --host")
                    ),
                ]
                for p in report.PHASES
            ],
        ),
        "",
        "## Where a --host command's time goes (before the switch starts; A still serves)",
        "",
        (
            "Median of 5 runs each. None of this is inside the downtime: the CLI starts, connects and starts the relay "
            "while A serves; the downtime is the agent's own steps on the box."
        ),
        "",
        report._md(["what", "median s"], [[k, f"{v:.3f}"] for k, v in prof.items()]),
        "",
        "## Every switch",
        "",
        report._md(
            ["method", "from", "to", "downtime s", "overhead s", "command s"],
            [
                [t.method, t.old, t.new, f"{t.downtime_s:.3f}", f"{t.overhead:+.3f}", f"{t.command_s:.2f}"]
                for trials in results.values()
                for t in trials
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--switches", type=int, default=6)
    p.add_argument("--load-time", type=float, default=2.0)
    p.add_argument("--stop-time", type=float, default=1.0)
    p.add_argument("--skip-bash", action="store_true")
    p.add_argument("--output", default=str(ROOT / "bench" / "remote" / "REMOTE.md"))
    args = p.parse_args()

    from tests.hosts.pool import boot_hosts

    started = time.time()
    load_before = report.load_now()[0]
    work = Path(tempfile.mkdtemp(prefix="remote-overhead-"))
    timing = Timing(load_s=args.load_time, stop_s=args.stop_time)
    control: Path | None = None
    try:
        with contextlib.closing(boot_hosts(1, netns=True)) as hs:
            host = hs.hosts[0]
            slot = host.address.rsplit(".", 1)[1]
            a, b = BenchModel(f"alpha-{slot}", 8201), BenchModel(f"beta-{slot}", 8202)
            bench = Bench(host, work, timing, [a, b])
            bench.deploy_toml()
            hosts_file(bench)
            log(f"host {host.name} at {host.address}: agent install")
            install_s = install_agent(bench)
            log(f"agent installed in {install_s:.1f} s")
            control, _ = control_master(bench)
            remote_switch(bench, b, a)  # first deploy of A (not measured)
            tools = {
                "floor": floor_switch_factory(control),
                "orchestrator": inprocess_switch,
                "via --host": remote_switch,
            }
            if not args.skip_bash:
                tools["bash"] = methods.bash_switch
            results, _ = interleaved(bench, tools, a, b, args.switches, a)
            prof = profile(bench)
            with contextlib.suppress(subprocess.SubprocessError):
                subprocess.run(
                    ["ssh", "-S", str(control), "-O", "exit", "x"], check=False, capture_output=True, timeout=10
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = render(
        results, timing, prof, install_s, sys.argv[1:], time.time() - started, (load_before, report.load_now()[0])
    )
    Path(args.output).write_text(text)
    log(f"wrote {args.output}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
