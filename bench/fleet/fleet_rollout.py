"""Wall time of a fleet rollout over 8 test hosts (batch 8, then batch 2) beside one host's switch and
beside `ansible-playbook -f 8` (every host at once, then `serial: 2`) doing the same switch, in one run.

Each host is a systemd-nspawn test host in its own network namespace running its own agent and the
stand-in engine (load time 0.3 s). `orchestrator rollout` runs on this machine as the controller.
Rounds alternate alpha -> beta -> alpha so every method switches between the same two known units.
Ansible runs with the agents stopped (their health watch would restart the model it stops) and
writes the unit the orchestrator renders for that host, as bench/downtime/switch_downtime.py does.

    .venv/bin/python bench/fleet/fleet_rollout.py [--rounds N] [--only one-host --only batch8 ...] \\
        > bench/fleet/fleet_rollout.txt
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from orchestrator import settings
from orchestrator.core.render import render_unit
from orchestrator.deploy.planning import default_template
from tests.builders.agent import CONFIG, PY
from tests.builders.rollout import SOCKET, install, one_host_env
from tests.builders.switch import MODELS
from tests.hosts.pool import HostSet, boot_hosts

VENV_BIN = Path(sys.executable).parent
ANSIBLE = REPO / "bench" / "baselines" / "ansible"
PAIR = {"alpha": "beta", "beta": "alpha"}
METHODS = ("one-host", "batch8", "batch2", "ansible")


def controller(hostset: HostSet, state: Path, one: str) -> str:
    lines = [f'state_dir = "{state}"']
    for h in hostset.hosts:
        lines += [
            f"[hosts.{h.name}]",
            f'address = "{h.address}"',
            f'ssh_key = "{hostset.key_path}"',
            f'known_hosts = "{hostset.known_hosts_path}"',
            f'python = "{PY}"',
            f'agent_socket = "{SOCKET}"',
        ]
    names = ", ".join(f'"{h.name}"' for h in hostset.hosts)
    lines += [
        f'[groups.fleet]\nhosts = [{names}]\ncanary = 0\nbatch = 8\ngate = "health"',
        f'[groups.one]\nhosts = ["{one}"]\ncanary = 0\nbatch = 1',
    ]
    for name in ("alpha", "beta"):
        m = MODELS[name]
        lines += [
            f"[models.{name}]",
            'group = "fleet"',
            f'repo = "test/{name}"',
            'source = "none"',
            "gpus = [0, 1, 2, 3]",
            "tensor_parallel = 4",
            f"port = {m['port']}",
        ]
    return "\n".join(lines) + "\n"


def inventory(hostset: HostSet, work: Path) -> Path:
    """YAML inventory: per host its own rendered units (the bind address differs) and health URL."""
    hosts = {}
    for h in hostset.hosts:
        cfg = work / f"box-{h.name}.toml"
        cat = settings.load(cfg)
        units = {n: render_unit(cat, cat.models[n], default_template()).text for n in ("alpha", "beta")}
        hosts[h.name] = {
            "ansible_host": h.address,
            "ansible_port": h.port,
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(h.key_path),
            "ansible_ssh_common_args": f"-F /dev/null -o IdentitiesOnly=yes -o UserKnownHostsFile={h.known_hosts_path}"
            " -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes",
            "units": units,
            "address": h.address,
        }
    path = work / "inventory.json"
    path.write_text(json.dumps({"gpu": {"hosts": hosts}}))
    return path


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    took = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        )
    return took


def ansible(inv: Path, new: str, serial: str | None) -> float:
    old = PAIR[new]
    extra = {
        "old_unit": f"vllm-{old}.service",
        "new_unit": f"vllm-{new}.service",
        "new_model": new,
        "gpus": "0,1,2,3",
        "unit_text": "{{ units['" + new + "'] }}",
        "health_url": "http://{{ address }}:" + str(MODELS[new]["port"]) + "/health",
    }
    if serial:
        extra["ansible_serial"] = serial
    return timed(
        [
            str(VENV_BIN / "ansible-playbook"),
            "-f",
            "8",
            "-i",
            str(inv),
            str(ANSIBLE / "switch.yml"),
            "-e",
            json.dumps(extra),
        ],
        {"ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--only", action="append", choices=METHODS, help="run only these methods (repeat the option); default: all"
    )
    args = ap.parse_args()
    only = set(args.only or METHODS)
    t_start = time.monotonic()
    print(f"# fleet rollout benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# machine: {os.cpu_count()} CPUs, {platform.platform()}, load {os.getloadavg()}")
    hostset = boot_hosts(8, netns=True)
    work = Path(f"/tmp/fleet-bench-{os.getpid()}")
    work.mkdir()
    try:
        for h in hostset.hosts:
            install(h, {"alpha": MODELS["alpha"], "beta": MODELS["beta"]})
            (work / f"box-{h.name}.toml").write_text(h.run(f"cat {CONFIG}").stdout)
            h.run(f"{PY} -m orchestrator switch alpha --config {CONFIG}")
        cfg = work / "deploy.toml"
        cfg.write_text(controller(hostset, work / "ctl", hostset.hosts[0].name))
        h1 = hostset.hosts[0]
        one_url, env = one_host_env(work, h1)
        cli = [PY, "-m", "orchestrator"]
        results: dict[str, list[float]] = {}

        def record(name: str, seconds: float) -> None:
            results.setdefault(name, []).append(seconds)
            print(f"{name}\t{seconds:.3f}", flush=True)

        state = "alpha"
        for _ in range(args.rounds):  # each pair of switches goes there and back: every host ends on alpha
            for new in (PAIR[state], state) if "one-host" in only else ():
                record("one host: orchestrator --host switch", timed([*cli, "--host", one_url, "switch", new], env))
            for new in (PAIR[state], state) if "one-host" in only else ():
                record(
                    "one host: orchestrator rollout (group of 1)",
                    timed([*cli, "rollout", new, "--group", "one", "--config", str(cfg)]),
                )
            for new in (PAIR[state], state) if "batch8" in only else ():
                record(
                    "8 hosts: orchestrator rollout --batch 8",
                    timed([*cli, "rollout", new, "--batch", "8", "--config", str(cfg)]),
                )
            for new in (PAIR[state], state) if "batch2" in only else ():
                record(
                    "8 hosts: orchestrator rollout --batch 2",
                    timed([*cli, "rollout", new, "--batch", "2", "--config", str(cfg)]),
                )
        for h in hostset.hosts:
            h.run("systemctl stop orchestrator-agent.service")
        inv = inventory(hostset, work)
        for _ in range(args.rounds if "ansible" in only else 0):
            for new in (PAIR[state], state):
                record("8 hosts: ansible-playbook -f 8", ansible(inv, new, None))
            for new in (PAIR[state], state):
                record("8 hosts: ansible-playbook -f 8, serial: 2", ansible(inv, new, "2"))
        print(f"# load at end {os.getloadavg()}, run {time.monotonic() - t_start:.0f} s")
        print("\n| method | runs | median s | min-max s |\n|---|---|---|---|")
        for name, xs in results.items():
            print(f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} |")
    finally:
        hostset.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
