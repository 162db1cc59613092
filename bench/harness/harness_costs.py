"""What the test-host harness's own steps cost on this machine: a boot, a command, the reset after a
test (clean, and after a test that added units), a daemon-reload, an in-host adapter process, a CLI
start in a host. Prints one line per step (median and min of N) and the load before and after.

    .venv/bin/python bench/harness/harness_costs.py [--repeats 5] > bench/harness/harness_costs.txt

Raw output of the last run: bench/harness/harness_costs.txt. The machine is shared: read the figures
against the load printed with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.hosts.inside import InsideAdapters
from tests.hosts.machine import Host
from tests.hosts.pool import boot_hosts

UNITS = (
    "printf '[Service]\\nExecStart=/bin/sleep 600\\n[Install]\\nWantedBy=multi-user.target\\n' "
    "> /etc/systemd/system/bench-unit.service && systemctl daemon-reload && systemctl enable --now bench-unit"
)


def timed(label: str, step: Callable[[], object], repeats: int, before: Callable[[], object] | None = None) -> None:
    took = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.monotonic()
        step()
        took.append(time.monotonic() - t0)
    print(f"{label:<44} median {statistics.median(took):6.3f} s   min {min(took):6.3f} s   (n={repeats})", flush=True)


def inside_once(h: Host) -> None:
    inside = InsideAdapters(h)
    inside.systemd.unit_state("x.service")
    inside.close()


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.repeats
    print(f"load before: {load()}   (nproc {os.cpu_count()})", flush=True)
    boots = []
    for _ in range(2):
        t0 = time.monotonic()
        with boot_hosts(1):
            boots.append(time.monotonic() - t0)
    print(f"{'boot of 1 host (until sshd and systemd ready)':<44} {boots}", flush=True)
    with boot_hosts(1) as hostset:
        h: Host = hostset.hosts[0]
        timed("a command over the shared SSH connection", lambda: h.run("true"), n)
        timed("systemctl daemon-reload in the host", lambda: h.run("systemctl daemon-reload"), n)
        timed("reset after a test that added nothing", h.reset, n)
        timed("reset after a test that added a unit", h.reset, n, before=lambda: h.run(UNITS))
        timed("in-host adapter process: start, a call, close", lambda: inside_once(h), n)
        timed(
            "the CLI in the host (history --help)",
            lambda: h.run(h.python_command("-m", "orchestrator", "history", "--help")),
            n,
        )
    print(f"load after: {load()}", flush=True)


if __name__ == "__main__":
    main()
