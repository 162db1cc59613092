"""The three ways to switch A -> B, each a blocking call that returns once B answers /health.

- orchestrator: the CLI (``python -m orchestrator switch B``) as an operator runs it, in-process or
  through the agent when one runs (the CLI decides).
- ansible: ``ansible-playbook bench/baselines/ansible/switch.yml`` over an ssh connection.
- bash: ``bench/baselines/bash/switch.sh``, one ssh call per step and a curl loop.
"""

from __future__ import annotations

import json
import os
import shlex
import string
import subprocess
import sys
import time
from pathlib import Path

from bench.downtime.setup import GPUS, LOCAL_CONFIG, REPO, Bench, BenchModel

ANSIBLE_DIR = REPO / "bench" / "baselines" / "ansible"
BASH_SCRIPT = REPO / "bench" / "baselines" / "bash" / "switch.sh"
VENV_BIN = Path(sys.executable).parent


class SwitchFailed(RuntimeError):
    pass


Phases = dict[str, float]


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[float, Phases]:
    t0 = time.monotonic()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout, cwd=REPO, check=False
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SwitchFailed(
            f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return wall, {}


def orchestrator_command(bench: Bench, model: BenchModel) -> list[str]:
    return [
        sys.executable,
        "-m",
        "orchestrator",
        "switch",
        model.name,
        "--config",
        str(bench.work / "deploy.toml"),
        "--json",
    ]


def local_command(bench: Bench, model: BenchModel) -> list[str]:
    """The CLI run on the host itself (ssh only starts it): local transport, systemd over D-Bus."""
    line = bench.host.python_command("-m", "orchestrator", "switch", model.name, "--config", LOCAL_CONFIG, "--json")
    return [*bench.host.ssh_argv(), "--", line]


def orchestrator_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, Phases]:
    """Returns the command's wall time and the seconds of each phase the orchestrator recorded."""
    return _orchestrator(orchestrator_command(bench, new))


def local_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, Phases]:
    return _orchestrator(local_command(bench, new))


def _orchestrator(argv: list[str]) -> tuple[float, Phases]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    wall = time.monotonic() - t0
    try:
        result = json.loads(proc.stdout)
    except ValueError:
        result = {}
    outcome = result.get("outcome")
    if proc.returncode != 0 or outcome != "active":
        raise SwitchFailed(
            f"{shlex.join(argv)} exited {proc.returncode} (outcome {outcome}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return wall, {p["phase"]: float(p["seconds"]) for p in result.get("phases", [])}


def write_inventory(bench: Bench) -> Path:
    h = bench.host
    text = string.Template((ANSIBLE_DIR / "inventory.ini.template").read_text()).substitute(
        name=h.name, address=h.address, port=h.port, key=h.key_path, known_hosts=h.known_hosts_path
    )
    path = bench.work / "inventory.ini"
    path.write_text(text)
    return path


def ansible_command(bench: Bench, old: BenchModel, new: BenchModel) -> list[str]:
    extra = {
        "old_unit": old.unit,
        "new_unit": new.unit,
        "new_model": new.name,
        "gpus": ",".join(map(str, GPUS)),
        "unit_text": bench.unit_text(new),
        "health_url": f"http://{bench.host.address}:{new.port}/health",
    }
    return [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(bench.work / "inventory.ini"),
        str(ANSIBLE_DIR / "switch.yml"),
        "-e",
        json.dumps(extra),
    ]


def ansible_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, Phases]:
    env = {"ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"), "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    return _run(ansible_command(bench, old, new), env)


def bash_env(bench: Bench, old: BenchModel, new: BenchModel) -> dict[str, str]:
    h = bench.host
    ssh_opts = " ".join(h.ssh_argv()[1:-1])  # between "ssh" and user@address; no spaces in them
    return {
        "TARGET": f"{h.user}@{h.address}",
        "SSH_OPTS": ssh_opts,
        "OLD_UNIT": old.unit,
        "NEW_UNIT": new.unit,
        "NEW_MODEL": new.name,
        "GPUS": ",".join(map(str, GPUS)),
        "UNIT_TEXT": bench.unit_text(new),
        "HEALTH_URL": f"http://{h.address}:{new.port}/health",
    }


def bash_switch(bench: Bench, old: BenchModel, new: BenchModel) -> tuple[float, Phases]:
    return _run(["bash", str(BASH_SCRIPT)], bash_env(bench, old, new))
