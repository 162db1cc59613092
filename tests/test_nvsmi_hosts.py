"""The nvidia-smi stand-in on a test host: the real line format (tests/fixtures/nvidia-smi, captured on
a real H200; their parsing: tests/unit/test_nvsmi.py), and NvidiaSmiProbe over it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.adapters.nvidia_smi import GpuProbeError, NvidiaSmiProbe
from orchestrator.core import nvsmi
from tests.hosts import Host
from tests.hosts.fixtures import Adapters

REAL = Path(__file__).parent / "fixtures" / "nvidia-smi"


def real(name: str) -> str:
    return (REAL / name).read_text()


# -- the stand-in on a test host --------------------------------------------------------------------

pytestmark = pytest.mark.hosts
GPU_LINE = re.compile(r"^\d+, GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}, [^,]+, \d+, \d+$")
APP_LINE = re.compile(r"^\d+, [^,]+, GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}, \d+$")


def hold(host: Host, gpus: list[int], mib: int) -> tuple[str, int]:
    """Start a process in the host and register it as holding memory, as the stand-in server does."""
    unit = f"t-holder-{len(gpus)}-{mib}.service"
    host.run(["systemd-run", f"--unit={unit}", "sleep", "1000"])
    pid = int(host.run(["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout)
    host.write_file(
        f"/run/standin-gpu/{pid}.json",
        json.dumps({"pid": pid, "name": "VLLM::EngineCore", "gpus": gpus, "mib_per_gpu": mib}),
    )
    return unit, pid


def test_standin_matches_the_real_line_format(host: Host) -> None:
    """The stand-in's lines have the shape of the real H200 lines, field for field."""
    hold(host, [0], 100)
    gpu_out = host.run(["nvidia-smi", *nvsmi.gpu_query()]).stdout.splitlines()
    app_out = host.run(["nvidia-smi", *nvsmi.apps_query()]).stdout.splitlines()
    assert GPU_LINE.match(real("gpu_held.csv").strip()) and APP_LINE.match(real("apps_held.csv").strip())
    assert len(gpu_out) == 8 and all(GPU_LINE.match(line) for line in gpu_out)
    assert len(app_out) == 1 and APP_LINE.match(app_out[0])


def test_standin_rejects_unknown_fields_like_the_real_one(host: Host) -> None:
    """An unknown field exits 2 with the real message on stdout."""
    res = host.run(["nvidia-smi", "--query-gpu=index,bogus.field", "--format=csv,noheader,nounits"], check=False)
    assert (res.returncode, res.stdout) == (2, 'Field "bogus.field" is not a valid field to query.\n\n')


def test_probe_reports_the_configured_gpus(adapters: Adapters) -> None:
    """With no holders the probe sees the GPUs gpus.json describes, all free."""
    adapters.host.set_gpus(count=2, memory_mib=1000, name="Test GPU")
    snap = NvidiaSmiProbe(adapters.shell).snapshot()
    assert [(g.index, g.name, g.memory_total_mib, g.memory_used_mib) for g in snap.gpus] == [
        (0, "Test GPU", 1000, 0),
        (1, "Test GPU", 1000, 0),
    ]
    assert snap.processes == ()


def test_probe_sees_memory_and_pid_then_sees_it_freed(adapters: Adapters) -> None:
    """A holder shows on its GPUs by PID; once its process ends the memory is free again."""
    unit, pid = hold(adapters.host, [1, 2], 70000)
    probe = NvidiaSmiProbe(adapters.shell)
    held = probe.snapshot()
    assert [(p.pid, p.gpu_index, p.used_memory_mib) for p in held.processes] == [(pid, 1, 70000), (pid, 2, 70000)]
    assert [g.memory_used_mib for g in held.gpus[:3]] == [0, 70000, 70000]
    adapters.host.run(["systemctl", "stop", unit])
    freed = probe.snapshot()
    assert freed.processes == () and all(g.memory_used_mib == 0 for g in freed.gpus)


def test_probe_without_nvidia_smi_raises_naming_the_host(adapters: Adapters) -> None:
    """A host with no nvidia-smi gives GpuProbeError naming the host and the exit code."""
    with pytest.raises(GpuProbeError) as err:
        NvidiaSmiProbe(adapters.shell, binary="/nonexistent/nvidia-smi").snapshot()
    assert adapters.host.name in str(err.value) and "127" in str(err.value)
