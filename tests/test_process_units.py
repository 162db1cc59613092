"""engine_check.py's systemd-free harness (scripts/process_units.py) driving the product's readiness and
freeing steps against the stand-in engine, as on the GPU machine."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.http_health import HttpHealthProbe
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.core.records import UnitSpec
from orchestrator.deploy import actions
from orchestrator.deploy.context import StepContext
from orchestrator.deploy.deployer import Deployer
from orchestrator.ports import HostPorts
from tests.hosts.wait import wait_for

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from process_units import ProcessUnits

Rig = tuple[ProcessUnits, UnitSpec, StepContext, NvidiaSmiProbe]


@pytest.fixture
def src() -> Iterator[Path]:
    """The checkout as the engine's unit sees it: vLLM units run with PrivateTmp=yes, so deploy.toml
    refuses an engine under /tmp; a checkout there (a fresh clone often is) is reached through a link."""
    if not str(REPO).startswith(("/tmp/", "/var/tmp/")):
        yield REPO
        return
    link = Path(f"/run/orchestrator-process-units-{os.getpid()}")
    link.unlink(missing_ok=True)
    link.symlink_to(REPO)
    try:
        yield link
    finally:
        link.unlink()


@pytest.fixture
def rig(tmp_path: Path, src: Path) -> Iterator[Rig]:
    exe = Path(sys.executable)
    python = src / exe.relative_to(REPO) if exe.is_relative_to(REPO) else exe
    gpu_dir = tmp_path / "gpu"
    gpu_dir.mkdir()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\nSTANDIN_GPU_DIR={gpu_dir} exec {sys.executable} {REPO / "tests/standin/nvidia_smi.py"} "$@"\n'
    )
    smi.chmod(0o755)
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(f'''state_dir = "{tmp_path / "state"}"
[defaults]
bind = "127.0.0.1"
user = "root"
group = "root"
allow_root = true
free_timeout_s = 6
stop_timeout_s = 5
health_interval_s = 0.05
[hosts.gpu]
transport = "local"
gpus = 1
gpu_memory_gib = 140
models_dir = "/var/lib/orchestrator-test/models"
engine = ["{python}", "{src / "tests/standin/vllm_compat.py"}"]
[models.m8]
repo = "local/m8"
source = "local:/var/lib/orchestrator-test/models/tiny-a"
port = 18671
gpus = [0]
tensor_parallel = 1
args = ["--engine-child", "--load-time", "0.5", "--gpu-state-dir", "{gpu_dir}"]
env = {{ STANDIN_GPU_MIB = "122666" }}
''')
    catalog = settings.load(cfg)
    spec = Deployer(catalog, None, lambda h: None).spec_for(catalog.models["m8"])  # type: ignore[arg-type]
    units = ProcessUnits("gpu", tmp_path)
    probe = NvidiaSmiProbe(LocalShell("gpu"), binary=str(smi))
    ports = HostPorts(
        host=catalog.hosts["gpu"],
        shell=LocalShell("gpu"),
        systemd=units,  # type: ignore[arg-type]
        gpus=probe,
        health=HttpHealthProbe(),
        clock=SystemClock(),
    )
    ctx = StepContext(ports=ports, catalog=catalog, progress=lambda event, fields: None)
    units.install_unit(spec.unit_name, spec.unit_text)
    units.start(spec.unit_name)
    yield units, spec, ctx, probe
    for pid in units.cgroup_pids(spec.unit_name):
        os.kill(pid, signal.SIGKILL)


def test_rendered_unit_runs_and_answers_readiness(rig: Rig) -> None:
    """The unit text the product rendered starts as a process session that passes wait_ready."""
    units, spec, ctx, probe = rig
    actions.wait_ready(ctx, spec)
    held = {p.pid: p.used_memory_mib for p in probe.snapshot().processes}
    session = units.cgroup_pids(spec.unit_name)
    assert (len(session), list(held.values()), set(held) <= set(session)) == (3, [122666], True)


def test_orphan_of_a_sigkilled_api_server_is_found_and_reaped(rig: Rig) -> None:
    """SIGKILL of the main process alone: the engine still holds its memory in the unit's session, and
    free_gpus reaps it and returns only once nvidia-smi shows the GPU free."""
    units, spec, ctx, probe = rig
    actions.wait_ready(ctx, spec)
    os.kill(units.main_pid(spec.unit_name), signal.SIGKILL)
    wait_for(lambda: units.unit_state(spec.unit_name).active_state == "failed", what="main process gone")
    orphans = units.cgroup_pids(spec.unit_name)
    assert [p.pid for p in probe.snapshot().processes if p.pid in orphans] != []
    actions.free_gpus(ctx, spec.gpus, {spec.unit_name})
    assert (units.cgroup_pids(spec.unit_name), probe.snapshot().processes) == ([], ())
