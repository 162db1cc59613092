"""nvidia-smi parsing (against outputs captured on a real H200) and the stand-in on test hosts.

tests/fixtures/nvidia-smi/*.csv came from tests/fixtures/nvidia-smi/capture.sh on the GPU
machine: a torch process held 20 GiB on GPU 0 (``*_held``), then exited (``*_freed``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.adapters.nvidia_smi import GpuProbeError, NvidiaSmiProbe
from orchestrator.core import nvsmi
from orchestrator.core.observed import GpuInfo, GpuProcess
from tests.hosts import Host
from tests.hosts.fixtures import Adapters

REAL = Path(__file__).parent / "fixtures" / "nvidia-smi"
H200_UUID = "GPU-ff9608d4-aaba-043f-96e2-349ad746bb45"


def real(name: str) -> str:
    return (REAL / name).read_text()


# -- parsing real outputs ---------------------------------------------------------------------------


def test_queries_ask_for_csv_without_header_or_units() -> None:
    """The probe's queries are the two documented CSV forms."""
    assert nvsmi.gpu_query() == [
        "--query-gpu=index,uuid,name,memory.total,memory.used",
        "--format=csv,noheader,nounits",
    ]
    assert nvsmi.apps_query() == [
        "--query-compute-apps=pid,process_name,gpu_uuid,used_memory",
        "--format=csv,noheader,nounits",
    ]


def test_real_gpu_holding_memory_is_seen_with_its_pid() -> None:
    """While torch holds 20 GiB, the GPU shows the memory and the process holds it by PID."""
    snap = nvsmi.parse_snapshot(real("gpu_held.csv"), real("apps_held.csv"))
    assert snap.gpus == (GpuInfo(0, H200_UUID, "NVIDIA H200", 143771, 21007),)
    assert snap.processes == (GpuProcess(435, "python3", H200_UUID, 20998, gpu_index=0),)
    assert snap.on({0}) == snap.processes


def test_real_gpu_after_the_process_exits_is_free() -> None:
    """After the holder exits, no process is listed and the memory reads 0 MiB used."""
    snap = nvsmi.parse_snapshot(real("gpu_freed.csv"), real("apps_freed.csv"))
    assert snap.processes == ()
    assert (snap.gpus[0].memory_used_mib, snap.gpus[0].memory_free_mib) == (0, 143771)


def test_no_compute_processes_is_an_empty_answer() -> None:
    """nvidia-smi prints nothing at all when no process holds a GPU."""
    assert real("apps_idle.csv") == ""
    assert nvsmi.parse_apps("", nvsmi.parse_gpus(real("gpu_idle.csv"))) == ()


def test_unavailable_values_read_as_zero() -> None:
    """[N/A] and [Not Supported] (MIG, vGPU, containers) read as 0 MiB instead of failing."""
    gpus = nvsmi.parse_gpus(
        f"0, {H200_UUID}, NVIDIA H200, 143771, [Not Supported]\n1, GPU-1, NVIDIA H200, [N/A], [N/A]\n"
    )
    assert [(g.memory_total_mib, g.memory_used_mib) for g in gpus] == [(143771, 0), (0, 0)]


def test_process_with_unknown_memory_still_holds_its_gpu() -> None:
    """A process whose used memory is [N/A] is still listed on its GPU."""
    gpus = nvsmi.parse_gpus(real("gpu_held.csv"))
    procs = nvsmi.parse_apps(f"4412, VLLM::EngineCore, {H200_UUID}, [N/A]\n", gpus)
    assert [(p.pid, p.gpu_index, p.used_memory_mib) for p in procs] == [(4412, 0, 0)]


def test_header_line_and_units_are_tolerated() -> None:
    """Output with a header and ' MiB' units (the real default format) parses the same."""
    text = f"pid, process_name, gpu_uuid, used_gpu_memory [MiB]\n435, python3, {H200_UUID}, 20998 MiB\n"
    assert nvsmi.parse_apps(text, nvsmi.parse_gpus(real("gpu_held.csv")))[0].used_memory_mib == 20998


def test_process_name_containing_a_comma_is_kept_whole() -> None:
    """Extra ', ' separators belong to the process name, the only free-text field."""
    procs = nvsmi.parse_apps(f"7, python3 -c a, b, {H200_UUID}, 5\n", nvsmi.parse_gpus(real("gpu_held.csv")))
    assert (procs[0].process_name, procs[0].used_memory_mib) == ("python3 -c a, b", 5)


def test_fields_in_another_order_parse_by_name() -> None:
    """Parsing follows the field list that was asked for."""
    gpus = nvsmi.parse_gpus("143771, 21007, 0\n", fields=("memory.total", "memory.used", "index"))
    assert (gpus[0].index, gpus[0].memory_used_mib) == (0, 21007)


def test_process_on_an_unlisted_gpu_has_index_minus_one() -> None:
    """A process whose GPU UUID is not among the GPUs gets gpu_index -1."""
    procs = nvsmi.parse_apps("9, x, GPU-unknown, 1\n", nvsmi.parse_gpus(real("gpu_held.csv")))
    assert procs[0].gpu_index == -1


def test_malformed_line_raises_naming_the_line() -> None:
    """A line with the wrong number of fields is an error that quotes the line."""
    with pytest.raises(nvsmi.NvsmiParseError, match="'0, GPU-x'"):
        nvsmi.parse_gpus("0, GPU-x\n")


def test_non_numeric_memory_raises_naming_the_value() -> None:
    """A memory value that is neither a number nor [N/A] is an error naming the value."""
    with pytest.raises(nvsmi.NvsmiParseError, match="'lots'"):
        nvsmi.parse_gpus(f"0, {H200_UUID}, NVIDIA H200, lots, 0\n")


# -- the stand-in on a test host --------------------------------------------------------------------

pytest_hosts = pytest.mark.hosts
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


@pytest_hosts
def test_standin_matches_the_real_line_format(host: Host) -> None:
    """The stand-in's lines have the shape of the real H200 lines, field for field."""
    hold(host, [0], 100)
    gpu_out = host.run(["nvidia-smi", *nvsmi.gpu_query()]).stdout.splitlines()
    app_out = host.run(["nvidia-smi", *nvsmi.apps_query()]).stdout.splitlines()
    assert GPU_LINE.match(real("gpu_held.csv").strip()) and APP_LINE.match(real("apps_held.csv").strip())
    assert len(gpu_out) == 8 and all(GPU_LINE.match(line) for line in gpu_out)
    assert len(app_out) == 1 and APP_LINE.match(app_out[0])


@pytest_hosts
def test_standin_rejects_unknown_fields_like_the_real_one(host: Host) -> None:
    """An unknown field exits 2 with the real message on stdout."""
    res = host.run(["nvidia-smi", "--query-gpu=index,bogus.field", "--format=csv,noheader,nounits"], check=False)
    assert (res.returncode, res.stdout) == (2, 'Field "bogus.field" is not a valid field to query.\n\n')


@pytest_hosts
def test_probe_reports_the_configured_gpus(adapters: Adapters) -> None:
    """With no holders the probe sees the GPUs gpus.json describes, all free."""
    adapters.host.set_gpus(count=2, memory_mib=1000, name="Test GPU")
    snap = NvidiaSmiProbe(adapters.shell).snapshot()
    assert [(g.index, g.name, g.memory_total_mib, g.memory_used_mib) for g in snap.gpus] == [
        (0, "Test GPU", 1000, 0),
        (1, "Test GPU", 1000, 0),
    ]
    assert snap.processes == ()


@pytest_hosts
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


@pytest_hosts
def test_probe_without_nvidia_smi_raises_naming_the_host(adapters: Adapters) -> None:
    """A host with no nvidia-smi gives GpuProbeError naming the host and the exit code."""
    with pytest.raises(GpuProbeError) as err:
        NvidiaSmiProbe(adapters.shell, binary="/nonexistent/nvidia-smi").snapshot()
    assert adapters.host.name in str(err.value) and "127" in str(err.value)
