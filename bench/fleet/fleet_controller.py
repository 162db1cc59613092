"""The controller's own overhead on real test hosts: one host's switch beside a rollout over 8 hosts
with batch 8, through the controller's agent, with an engine whose load is a fixed sleep.

Each host is a systemd-nspawn test host in its own network namespace running its own agent and the
stand-in engine with `--load-time L --load-time-from-start` (a sleep before /health answers, counted
from the engine's exec: the stand-in's own start, ~0.15 CPU s of Python imports, runs inside the sleep, so
8 of them on 2 cores do not hide the controller's part in CPU contention). The
controller is an agent on this machine (`orchestrator agent` with the fleet's deploy.toml); the
client is a CLI reaching its socket. Rounds alternate alpha -> beta -> alpha. A third method switches
the same 8 hosts without the controller, 8 CLIs started at once (`--host URL switch` each): the same
work on the same 2 cores, so the controller's own share is the rollout's excess over it.

Per run it prints the wall time, and for a rollout what its record (rollouts.db) splits it into:
before the first switch (CLI start, connects, preflight fan-outs), the switches (first switch start
to last end), and after (gate, finish, the CLI's exit), with the CPU seconds the controller's agent
and the client CLI used (the rest of the machine's CPU went to the 8 boxes: agents, relays, engines).

Each run is followed by its profile: per phase, the wall seconds and the CPU seconds of the
controller's agent and of the boxes' processes by kind (bench/fleet/fleet_profile.py).

    .venv/bin/python bench/fleet/fleet_controller.py [--rounds N] [--load-time S] > bench/fleet/fleet_controller.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.fleet.fleet_profile import ROLES, Sampler
from tests.builders.agent import CONFIG, PY
from tests.builders.rollout import SOCKET, install, one_host_env
from tests.builders.switch import MODELS
from tests.hosts.machine import HostError
from tests.hosts.pool import HostSet, boot_hosts

PAIR = {"alpha": "beta", "beta": "alpha"}
IDLE_S = 10.0


def controller_config(hostset: HostSet, state: Path) -> str:
    lines = [f'state_dir = "{state}"']
    for h in hostset.hosts:
        lines += [
            f"[hosts.{h.name}]",
            f'address = "{h.address}"',
            f"ssh_port = {h.port}",
            f'ssh_key = "{hostset.key_path}"',
            f'known_hosts = "{hostset.known_hosts_path}"',
            f'python = "{PY}"',
            f'agent_socket = "{SOCKET}"',
        ]
    names = ", ".join(f'"{h.name}"' for h in hostset.hosts)
    lines += [f'[groups.fleet]\nhosts = [{names}]\ncanary = 0\nbatch = 8\ngate = "health"']
    for name in ("alpha", "beta"):
        lines += [
            f"[models.{name}]",
            'group = "fleet"',
            f'repo = "test/{name}"',
            'source = "none"',
            "gpus = [0, 1, 2, 3]",
            "tensor_parallel = 4",
            f"port = {MODELS[name]['port']}",
        ]
    return "\n".join(lines) + "\n"


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, **env})
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return took


def install_serving_alpha(hostset: HostSet, load_time: float) -> None:
    """Each host's agent with alpha and beta (a stand-in whose load is a fixed sleep from its exec),
    alpha switched to."""
    # The test hosts' load deadline is 30 s: a load near or past it gets a deadline 30 s past the load.
    deadline = {"load_deadline_s": int(load_time + 30)} if load_time + 5 > 30 else {}
    models = {
        n: {**MODELS[n], "args": ["--load-time", f"{load_time:g}", "--load-time-from-start"], **deadline}
        for n in ("alpha", "beta")
    }
    for h in hostset.hosts:
        for attempt in range(3):  # on a loaded machine an agent's start can exceed its unit's start timeout
            try:
                install(h, models)
                break
            except HostError as exc:
                print(f"# {h.name}: agent start failed (attempt {attempt + 1}): {str(exc).splitlines()[0]}")
        h.run(f"{PY} -m orchestrator switch alpha --config {CONFIG}")


def all_hosts_env(work: Path, hostset: HostSet) -> tuple[list[str], dict[str, str]]:
    """Every host by its ssh:// URL, and the environment naming one hosts file that gives each its key,
    known_hosts, python and the agent's socket (as one_host_env does for one)."""
    urls, text = [], ""
    for h in hostset.hosts:
        url = f"ssh://root@{h.address}:{h.port}"
        urls.append(url)
        text += (
            f'["{url}"]\nurl = "{url}"\nkey = "{h.key_path}"\nknown_hosts = "{h.known_hosts_path}"\n'
            f'python = "{PY}"\nsocket = "{SOCKET}"\n'
        )
    hosts_file = work / "all-hosts.toml"
    hosts_file.write_text(text)
    return urls, {"ORCHESTRATOR_HOSTS_FILE": str(hosts_file)}


def timed_together(argvs: list[list[str]], env: dict[str, str]) -> float:
    """Wall seconds from starting every command at once to the last one's exit (each must succeed)."""
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
        for a in argvs
    ]
    outs = [p.communicate()[0] for p in procs]
    took = time.monotonic() - t0
    for a, p, out in zip(argvs, procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(a[:6])} ... exited {p.returncode}:\n{out[-2000:]}")
    return took


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def phases(db: Path, t_start: float, wall: float) -> list[tuple[str, float, float]]:
    """The latest rollout's record as phases (name, start, end; time.time()): the client's start and
    the preflight up to the record, the record to the first switch, the switches, and after the last."""
    con = sqlite3.connect(db)
    try:
        rid, started = con.execute("SELECT id, started_at FROM rollouts ORDER BY id DESC LIMIT 1").fetchone()
        first, last = con.execute(
            "SELECT MIN(switched_at), MAX(ended_at) FROM rollout_hosts WHERE rollout_id = ?", (rid,)
        ).fetchone()
    finally:
        con.close()
    return [
        ("to record", t_start, started),
        ("record to first switch", started, first),
        ("switches", first, last),
        ("after", last, t_start + wall),
    ]


def split(marks: list[tuple[str, float, float]]) -> str:
    before = marks[0][2] - marks[0][1] + marks[1][2] - marks[1][1]
    return (
        f"before {before:.2f} (to record {marks[0][2] - marks[0][1]:.2f}) switches "
        f"{marks[2][2] - marks[2][1]:.2f} after {marks[3][2] - marks[3][1]:.2f}"
    )


COLUMNS = ("controller agent", *ROLES)


def cpu_line(cpu: dict[str, float]) -> str:
    return " ".join(f"{k} {cpu.get(k, 0.0):.2f}" for k in COLUMNS)


def profile(sampler: Sampler, marks: list[tuple[str, float, float]]) -> list[str]:
    """One line per phase: its wall seconds and the CPU seconds each kind of process used in it."""
    return [
        f"#   {name:<23} wall {t1 - t0:6.2f} s  CPU s: {cpu_line(sampler.between(t0, t1))}" for name, t0, t1 in marks
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load-time", type=float, default=5.0, help="the stand-in engine's load sleep, seconds")
    args = ap.parse_args()
    t_run = time.monotonic()
    print(f"# controller overhead benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# machine: {os.cpu_count()} CPUs, {platform.platform()}, load {os.getloadavg()}")
    print(
        f"# engine: stand-in, --load-time {args.load_time:g} --load-time-from-start (a sleep from its exec), "
        "8 netns test hosts, batch 8, canary 0"
    )
    hostset = boot_hosts(8, netns=True)
    work = Path(tempfile.mkdtemp(prefix="fleet-ctl-bench-"))  # removed at the end; its log is printed on failure
    agent: subprocess.Popen[bytes] | None = None
    try:
        install_serving_alpha(hostset, args.load_time)
        cfg = work / "deploy.toml"
        state = work / "ctl"
        cfg.write_text(controller_config(hostset, state))
        with (work / "controller.log").open("ab") as log:
            agent = subprocess.Popen(
                [PY, "-m", "orchestrator", "agent", "--config", str(cfg), "--metrics-port", "0"],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not (state / "agent.sock").exists():
            if time.monotonic() > deadline or agent.poll() is not None:
                raise SystemExit("the controller's agent did not start:\n" + (work / "controller.log").read_text())
            time.sleep(0.1)
        h1 = hostset.hosts[0]
        one_url, env = one_host_env(work, h1)
        all_urls, all_env = all_hosts_env(work, hostset)
        cli = [PY, "-m", "orchestrator"]
        results: dict[str, list[float]] = {}

        def record(name: str, seconds: float, detail: str = "") -> None:
            results.setdefault(name, []).append(seconds)
            print(f"{name}\t{seconds:.3f}" + (f"\t{detail}" if detail else ""), flush=True)

        sampler = Sampler([h.machine for h in hostset.hosts], {"controller agent": agent.pid})
        sampler.start()
        print(
            f"# per-phase CPU: sampled every {sampler.interval_s} s (bench/fleet/fleet_profile.py); columns: "
            f"{', '.join(COLUMNS)}"
        )
        idle_t0 = time.time()
        time.sleep(IDLE_S)  # what the 8 idle boxes use by themselves (their agents' loops, systemd)
        idle = sampler.between(idle_t0, idle_t0 + IDLE_S)
        print(
            f"#   {'idle, per second':<23} wall {IDLE_S:6.2f} s  CPU s: "
            f"{cpu_line({k: v / IDLE_S for k, v in idle.items()})}"
        )
        state_model = "alpha"
        for _ in range(args.rounds):
            for new in (PAIR[state_model], state_model):
                cli_cpu, t0 = children_cpu_s(), time.time()
                took = timed([*cli, "--host", one_url, "switch", new], env)
                record(
                    "one host: orchestrator --host switch",
                    took,
                    f"client CLI CPU {children_cpu_s() - cli_cpu:.2f} s, load {os.getloadavg()[0]:.1f}",
                )
                time.sleep(2 * sampler.interval_s)  # a sample after the end
                print(
                    f"#   {'whole command':<23} wall {took:6.2f} s  CPU s: {cpu_line(sampler.between(t0, t0 + took))}"
                )
            for new in (PAIR[state_model], state_model):
                t0, agent_cpu, cli_cpu = time.time(), cpu_s(agent.pid), children_cpu_s()
                took = timed([*cli, "rollout", new, "--batch", "8", "--config", str(cfg)], env)
                cpu = (
                    f"controller agent CPU {cpu_s(agent.pid) - agent_cpu:.2f} s, client CLI CPU "
                    f"{children_cpu_s() - cli_cpu:.2f} s, load {os.getloadavg()[0]:.1f}"
                )
                marks = phases(state / "rollouts.db", t0, took)
                record("8 hosts: rollout --batch 8 through the controller", took, f"{split(marks)}; {cpu}")
                time.sleep(2 * sampler.interval_s)
                print("\n".join(profile(sampler, marks)))
            # The same 8 switches without a controller: 8 CLIs at once, one `--host URL switch` each (what a
            # hand script over the fleet does): what 8 concurrent switches cost on this machine by themselves.
            for new in (PAIR[state_model], state_model):
                cli_cpu, t0 = children_cpu_s(), time.time()
                took = timed_together([[*cli, "--host", u, "switch", new] for u in all_urls], all_env)
                record(
                    "8 hosts: 8 CLIs at once, --host switch each (no controller)",
                    took,
                    f"client CLIs CPU {children_cpu_s() - cli_cpu:.2f} s, load {os.getloadavg()[0]:.1f}",
                )
                time.sleep(2 * sampler.interval_s)
                print(
                    f"#   {'whole commands':<23} wall {took:6.2f} s  CPU s: {cpu_line(sampler.between(t0, t0 + took))}"
                )
        sampler.close()
        print(f"# load at end {os.getloadavg()}, run {time.monotonic() - t_run:.0f} s")
        one = statistics.median(results["one host: orchestrator --host switch"])
        eight = statistics.median(results["8 hosts: 8 CLIs at once, --host switch each (no controller)"])
        print(
            "\n| method | runs | median s | min-max s | vs one host's switch | vs 8 CLIs at once |\n"
            "|---|---|---|---|---|---|"
        )
        for name, xs in results.items():
            print(
                f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} | "
                f"{statistics.median(xs) / one:.2f}x | {statistics.median(xs) / eight:.2f}x |"
            )
    finally:
        if agent is not None and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=120)
        hostset.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
