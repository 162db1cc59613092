"""Where one switch's CPU goes on its box: per process, its reaped children included, and per step.

Boots ``--hosts`` netns test hosts (each with its own agent and the stand-in engine whose load is a
``--load-time`` sleep, as bench/fleet/fleet_controller.py does), then switches ``--switches`` times between
alpha and beta on every host at once (``--hosts 1``: one host's switch). Per switch it prints:

- the wall time of each step, from the CLI's progress lines as they arrive;
- the CPU seconds of every kind of process on the boxes (bench/fleet/fleet_profile.py's roles), and of the
  children each kind reaped during the switch (a process's cutime/cstime: what short-lived processes
  cost, named by their parent: the agent's shells and nvidia-smi calls, sshd's relays). A reaped
  child counts with its whole life: "children of systemd" is mostly the old engines, started in an
  earlier switch; "total (cpuacct)" is what the boxes used during this one;
- with ``--execs``, every program the boxes started during the switch, counted (strace -f -e execve
  on each box's agent; strace slows the agent, so the CPU figures of such a run are not the clean ones);
- with ``--py-spy DIR``, a py-spy profile of each box's agent during the switch (raw, collapsed stacks).

    .venv/bin/python bench/fleet/fleet_switch_profile.py [--hosts N] [--switches K] [--execs] [--py-spy DIR]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.fleet.fleet_controller import all_hosts_env, install_serving_alpha
from bench.fleet.fleet_profile import CPUACCT, _role
from tests.builders.agent import PY
from tests.hosts.pool import boot_hosts

_TICK = os.sysconf("SC_CLK_TCK")
PAIR = {"alpha": "beta", "beta": "alpha"}


def snapshot(machines: list[str]) -> tuple[float, dict[int, tuple[str, float, float]]]:
    """(the boxes' total CPU s, pid -> (role, own CPU s, reaped children's CPU s))."""
    total, procs = 0.0, {}
    for m in machines:
        group = CPUACCT / f"testhost-{m}"
        total += int((group / "cpuacct.usage").read_text()) / 1e9
        for pid in (int(p) for p in (group / "cgroup.procs").read_text().split()):
            try:
                f = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            except OSError:
                continue
            procs[pid] = (_role(pid), (int(f[11]) + int(f[12])) / _TICK, (int(f[13]) + int(f[14])) / _TICK)
    return total, procs


def cpu_table(
    before: tuple[float, dict[int, tuple[str, float, float]]], after: tuple[float, dict[int, tuple[str, float, float]]]
) -> dict[str, float]:
    own: dict[str, float] = collections.defaultdict(float)
    for pid, (role, cpu, children) in after[1].items():
        was = before[1].get(pid)
        own[role] += cpu - (was[1] if was else 0.0)
        if was:  # a process born during the switch: its children count in its own figure at its exit
            own[f"children of {role}"] += children - was[2]
    for pid, (role, cpu, _) in before[1].items():
        if pid not in after[1]:
            own[f"gone ({role})"] += 0.0  # its CPU went to its parent's children figure
    own["total (cpuacct)"] = after[0] - before[0]
    return dict(own)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--switches", type=int, default=4)
    ap.add_argument("--load-time", type=float, default=5.0)
    ap.add_argument("--execs", action="store_true", help="count the programs started (strace on the agents)")
    ap.add_argument("--py-spy", type=Path, help="write a py-spy profile of each agent per switch here")
    args = ap.parse_args()
    print(
        f"# switch profile, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()}, {args.hosts} host(s), stand-in engine --load-time {args.load_time:g}",
        flush=True,
    )
    hostset = boot_hosts(args.hosts, netns=True)
    work = Path(f"/tmp/fleet-switch-profile-{os.getpid()}")
    work.mkdir()
    try:
        install_serving_alpha(hostset, args.load_time)
        urls, env = all_hosts_env(work, hostset)
        machines = [h.machine for h in hostset.hosts]
        agents = []
        for h in hostset.hosts:
            main_pid = h.run("systemctl show -p MainPID --value orchestrator-agent.service").stdout.strip()
            # the agent's PID as this machine sees it: NSpid's first field is ours
            group = CPUACCT / f"testhost-{h.machine}"
            for pid in (int(p) for p in (group / "cgroup.procs").read_text().split()):
                try:
                    nspid = [x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("NSpid")]
                except OSError:
                    continue
                if nspid and nspid[0].split()[-1] == main_pid:
                    agents.append(pid)
        print(f"# agents (this machine's pids): {agents}", flush=True)
        model = "alpha"
        time.sleep(3)
        if args.py_spy:  # what an idle agent does by itself
            args.py_spy.mkdir(parents=True, exist_ok=True)
            idle0 = snapshot(machines)
            subprocess.run(
                [
                    str(REPO / ".venv/bin/py-spy"),
                    "record",
                    "-p",
                    str(agents[0]),
                    "-r",
                    "50",
                    "-d",
                    "10",
                    "-f",
                    "raw",
                    "-o",
                    str(args.py_spy / "idle-agent.txt"),
                ],
                capture_output=True,
                check=False,
            )
            print(
                "# CPU s of the idle boxes over 10 s:",
                {k: round(v, 2) for k, v in cpu_table(idle0, snapshot(machines)).items() if v >= 0.005},
            )
        for i in range(args.switches):
            new = PAIR[model]
            helpers: list[subprocess.Popen[bytes]] = []
            if args.execs:
                helpers += [
                    subprocess.Popen(
                        [
                            "strace",
                            "-f",
                            "-qq",
                            "-e",
                            "trace=execve",
                            "-o",
                            str(work / f"execs-{i}-{pid}"),
                            "-p",
                            str(pid),
                        ]
                    )
                    for pid in agents
                ]
                time.sleep(1)
            if args.py_spy:
                args.py_spy.mkdir(parents=True, exist_ok=True)
                helpers += [
                    subprocess.Popen(
                        [
                            str(REPO / ".venv/bin/py-spy"),
                            "record",
                            "-p",
                            str(pid),
                            "-r",
                            "50",
                            "-f",
                            "raw",
                            "-o",
                            str(args.py_spy / f"switch{i}-agent{pid}.txt"),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for pid in agents
                ]
                time.sleep(1)
            before, t0 = snapshot(machines), time.monotonic()
            procs = [
                subprocess.Popen(
                    [PY, "-m", "orchestrator", "--host", u, "switch", new],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env},
                    text=True,
                )
                for u in urls
            ]
            lines = []
            assert procs[0].stdout is not None
            for line in procs[0].stdout:
                lines.append((time.monotonic() - t0, line.rstrip()))
            for p in procs:
                p.communicate()
            wall = time.monotonic() - t0
            after = snapshot(machines)
            bad = [p.returncode for p in procs if p.returncode]
            for h in helpers:
                h.send_signal(2)
            for h in helpers:
                h.wait(timeout=30)
            print(
                f"\n## switch {i + 1}: {model} -> {new} on {args.hosts} host(s): wall {wall:.2f} s, "
                f"load {os.getloadavg()[0]:.1f}" + (f", FAILED {bad}" if bad else "")
            )
            print("# h1's progress (s since start):")
            for t, line in lines:
                print(f"#   {t:6.2f}  {line[:150]}")
            print("# CPU s on the boxes during the switch, by kind:")
            for k, v in sorted(cpu_table(before, after).items(), key=lambda kv: -kv[1]):
                if v >= 0.005:
                    print(f"#   {k:<28} {v:6.2f}")
            if args.execs:
                counts: collections.Counter[str] = collections.Counter()
                for f in work.glob(f"execs-{i}-*"):
                    for line in f.read_text().splitlines():
                        if "execve(" in line and "= 0" in line:
                            counts[line.split('execve("', 1)[1].split('"', 1)[0]] += 1
                print("# programs started by the agents (strace execve):")
                for prog, n in counts.most_common():
                    print(f"#   {n:4d}  {prog}")
            model = new
            time.sleep(2)
    finally:
        hostset.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
