"""nvidia-smi parsing, against outputs captured on a real H200 (the stand-in on test hosts:
tests/test_nvsmi_hosts.py).

tests/fixtures/nvidia-smi/*.csv came from tests/fixtures/nvidia-smi/capture.sh on the GPU
machine: a torch process held 20 GiB on GPU 0 (``*_held``), then exited (``*_freed``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core import nvsmi
from orchestrator.core.observed import GpuInfo, GpuProcess

REAL = Path(__file__).parents[1] / "fixtures" / "nvidia-smi"
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
