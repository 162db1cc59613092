"""Where a rollout's CPU goes, phase by phase and process by process: a sampler for
bench/fleet/fleet_controller.py.

Every ``interval_s`` it reads each test host's CPU account (cgroup v1 cpuacct.usage of testhost-NAME:
every process of that container, dead ones included) and the CPU of each process in it, by role from
its command line: the box's agent, its engines (the stand-in API server and its engine child), sshd,
the relays (`python -m orchestrator.agent.relay`, one per request), the box's systemd (PID 1 and its
helpers), D-Bus, journald, and the rest.
A process is counted under the role its command line had at its last sample (a unit's process is
systemd's until it execs), and keeps the last CPU figure sampled when it exits, so the sums only
grow; what the container used beyond them is "unsampled" (processes shorter than one interval:
mostly relays and the shells that exec them). The controller's agent and the client CLI are sampled by pid.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
ROLES = ("box agents", "engines", "nvidia-smi", "sshd", "relays", "systemd", "dbus", "journald", "other", "unsampled")
_TICK = os.sysconf("SC_CLK_TCK")


def role_of(cmdline: bytes) -> str:
    if b"orchestrator.agent.relay" in cmdline:
        return "relays"
    if b"nvidia_smi" in cmdline or b"nvidia-smi" in cmdline:
        return "nvidia-smi"  # the agent's GPU probes (the stand-in's script here)
    if b"openai_server.py" in cmdline or b"--engine-child" in cmdline:
        return "engines"
    if b"orchestrator\x00agent" in cmdline:
        return "box agents"
    argv0 = cmdline.split(b"\x00")[0]
    if cmdline.startswith(b"sshd") or b"/sshd" in argv0:
        return "sshd"
    if b"journald" in argv0:
        return "journald"
    if b"dbus" in argv0:
        return "dbus"
    if b"systemd" in argv0 or argv0 in (b"/sbin/init", b"/usr/sbin/init"):
        return "systemd"  # the box's PID 1 and its helpers (logind, udevd, ...)
    return "other"


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


class Sampler:
    def __init__(self, machines: list[str], pids: dict[str, int], interval_s: float = 0.25) -> None:
        self.machines, self.pids, self.interval_s = machines, dict(pids), interval_s
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (role, last CPU s)
        self.samples: list[tuple[float, dict[str, float]]] = []  # (time.time(), what -> CPU s so far)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> None:
        self.sample()
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()

    def _run(self) -> None:
        while not self.stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        total = 0.0
        for m in self.machines:
            group = CPUACCT / f"testhost-{m}"
            try:
                total += int((group / "cpuacct.usage").read_text()) / 1e9
                pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
            except OSError:
                continue
            for pid in pids:
                cpu = proc_cpu(pid)
                if cpu is None:
                    continue
                # read each time: a process forked by systemd or sshd is theirs until it execs
                self.seen[pid] = (_role(pid), cpu)
        row = dict.fromkeys(ROLES, 0.0)
        for role, cpu in self.seen.values():
            row[role] += cpu
        row["unsampled"] = total - sum(row[r] for r in ROLES if r != "unsampled")
        for name, pid in self.pids.items():
            cpu = proc_cpu(pid)
            row[name] = cpu if cpu is not None else (self.samples[-1][1].get(name, 0.0) if self.samples else 0.0)
        self.samples.append((time.time(), row))

    def at(self, t: float) -> dict[str, float]:
        """The sample taken nearest after ``t`` (the last one if none is)."""
        i = min(bisect_left([s[0] for s in self.samples], t), len(self.samples) - 1)
        return self.samples[i][1]

    def between(self, t0: float, t1: float) -> dict[str, float]:
        a, b = self.at(t0), self.at(t1)
        return {k: b.get(k, 0.0) - a.get(k, 0.0) for k in b}


def _role(pid: int) -> str:
    try:
        return role_of(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return "other"
