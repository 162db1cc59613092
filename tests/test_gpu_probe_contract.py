"""The GpuProbe contract, held by both adapters on one stand-in GPU state: NvidiaSmiProbe over the
stand-in nvidia-smi, NvmlProbe over the stand-in libnvidia-ml.so.1 (found by the dynamic linker in a
child process, as the driver's is); and how wiring chooses between them for a host."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from orchestrator.core.observed import GpuSnapshot
from orchestrator.errors import GpuProbeError
from tests.builders.gpu_probes import HOST, NvmlChild, StandinGpus, build_fake_nvml, smi_probe
from tests.standin.nvidia_smi import gpu_uuid

ADAPTERS = ["nvidia-smi", "nvml"]


class Probe(Protocol):
    def snapshot(self) -> GpuSnapshot: ...


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture
def gpus(tmp_path: Path) -> Iterator[StandinGpus]:
    state = StandinGpus(tmp_path)
    state.set_gpus(count=4, memory_mib=1000)
    yield state
    state.close()


@pytest.fixture
def children() -> Iterator[list[NvmlChild]]:
    made: list[NvmlChild] = []
    yield made
    for child in made:
        child.close()


def probe_for(
    adapter: str, gpus: StandinGpus, tmp_path: Path, nvml_lib: Path, children: list[NvmlChild], **env: str
) -> Probe:
    if adapter == "nvidia-smi":
        return smi_probe(gpus, tmp_path)
    children.append(NvmlChild(gpus, nvml_lib, env=env))
    return children[-1]


@pytest.fixture(params=ADAPTERS)
def probe(
    request: pytest.FixtureRequest, gpus: StandinGpus, tmp_path: Path, nvml_lib: Path, children: list[NvmlChild]
) -> Probe:
    return probe_for(request.param, gpus, tmp_path, nvml_lib, children)


# -- the contract, for each adapter ------------------------------------------------------------------


def test_configured_gpus_are_reported_free(probe: Probe, gpus: StandinGpus) -> None:
    """With no holders, each configured GPU shows with its index, UUID, name and total, 0 MiB used."""
    snap = probe.snapshot()
    assert [(g.index, g.uuid, g.name, g.memory_total_mib, g.memory_used_mib) for g in snap.gpus] == [
        (i, gpu_uuid(i), "Test GPU", 1000, 0) for i in range(4)
    ]
    assert snap.processes == ()


def test_a_holder_shows_by_pid_and_mib_on_each_of_its_gpus(probe: Probe, gpus: StandinGpus) -> None:
    """A holder of 700 MiB on GPUs 1 and 2 shows on both by PID, name and MiB, and in their used memory."""
    pid = gpus.hold([1, 2], 700).pid
    snap = probe.snapshot()
    assert [(p.pid, p.process_name, p.gpu_index, p.gpu_uuid, p.used_memory_mib) for p in snap.processes] == [
        (pid, "VLLM::EngineCore", 1, gpu_uuid(1), 700),
        (pid, "VLLM::EngineCore", 2, gpu_uuid(2), 700),
    ]
    assert [g.memory_used_mib for g in snap.gpus] == [0, 700, 700, 0]
    assert snap.gpus[1].memory_free_mib == 300


def test_a_dead_holder_disappears_and_its_memory_frees(probe: Probe, gpus: StandinGpus) -> None:
    """Once the holder is killed (its file left behind, as a crash leaves it), it holds nothing."""
    holder = gpus.hold([0], 400)
    assert [p.pid for p in probe.snapshot().processes] == [holder.pid]
    gpus.kill(holder)
    snap = probe.snapshot()
    assert snap.processes == () and [g.memory_used_mib for g in snap.gpus] == [0, 0, 0, 0]


def test_a_zombie_holder_holds_nothing(probe: Probe, gpus: StandinGpus) -> None:
    """A holder that died but is not reaped yet (a zombie) no longer holds its GPU."""
    holder = gpus.hold([3], 100)
    gpus.kill(holder, reap=False)
    assert probe.snapshot().processes == ()


def test_memory_held_by_several_processes_adds_up(probe: Probe, gpus: StandinGpus) -> None:
    """Two holders on one GPU: both listed by PID (ascending), the GPU's used memory is their sum."""
    a, b = gpus.hold([0], 100, name="python3"), gpus.hold([0], 250)
    snap = probe.snapshot()
    assert sorted((p.pid, p.used_memory_mib) for p in snap.on({0})) == sorted([(a.pid, 100), (b.pid, 250)])
    assert snap.gpus[0].memory_used_mib == 350


def test_no_gpus_is_an_empty_snapshot(probe: Probe, gpus: StandinGpus) -> None:
    """A box that reports no GPUs gives an empty snapshot, not an error."""
    gpus.set_gpus(count=0)
    assert probe.snapshot() == GpuSnapshot(gpus=())


def test_no_driver_is_a_gpu_probe_error_naming_the_host(probe: Probe, gpus: StandinGpus) -> None:
    """A box whose driver is not loaded: GpuProbeError naming the host (nvidia-smi exits 9, NVML error 9)."""
    gpus.set_gpus(driver=False)
    with pytest.raises(GpuProbeError) as err:
        probe.snapshot()
    assert f"host {HOST}" in str(err.value)
    assert "exited 9: NVIDIA-SMI has failed" in str(err.value) or "Driver Not Loaded (NVML error 9)" in str(err.value)


# -- both adapters agree ----------------------------------------------------------------------------


def test_both_adapters_give_equal_snapshots(
    gpus: StandinGpus, tmp_path: Path, nvml_lib: Path, children: list[NvmlChild]
) -> None:
    """Several holders on several GPUs (one dead): nvidia-smi and NVML give the very same snapshot."""
    gpus.set_gpus(count=8, memory_mib=143771, name="NVIDIA H200")
    gpus.hold([0, 1, 2, 3], 122666)
    gpus.hold([4, 5], 40000, name="python3")
    gpus.hold([5], 1536, name="VLLM::Worker_TP1")
    gpus.kill(gpus.hold([6, 7], 9000))
    smi, nvml = (probe_for(a, gpus, tmp_path, nvml_lib, children) for a in ADAPTERS)
    snap = smi.snapshot()
    assert len(snap.processes) == 7 and snap.gpus[5].memory_used_mib == 41536
    assert nvml.snapshot() == snap


def test_nvml_without_memory_v2_reads_the_same(
    gpus: StandinGpus, tmp_path: Path, nvml_lib: Path, children: list[NvmlChild]
) -> None:
    """On a driver without nvmlDeviceGetMemoryInfo_v2 the NVML probe falls back to v1, same figures."""
    gpus.hold([1], 512)
    old = probe_for("nvml", gpus, tmp_path, nvml_lib, children, STANDIN_NVML_NO_MEMORY_V2="1")
    assert old.snapshot() == smi_probe(gpus, tmp_path).snapshot()


def test_nvml_without_its_library_is_a_gpu_probe_error(gpus: StandinGpus, children: list[NvmlChild]) -> None:
    """No libnvidia-ml.so.1 to load: GpuProbeError naming the host and NVML's own error."""
    children.append(NvmlChild(gpus, None))
    with pytest.raises(GpuProbeError, match=f"host {HOST}: NVML nvmlInit: NVML Shared Library Not Found"):
        children[-1].snapshot()


# -- the choice wiring makes, once per host -----------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "local", "library", "chosen"),
    [
        ("auto", True, True, "NvmlProbe"),
        ("auto", True, False, "NvidiaSmiProbe"),  # no driver library here: nvidia-smi answers
        ("auto", False, True, "NvidiaSmiProbe"),  # NVML reads only the agent's own box
        ("nvidia-smi", True, True, "NvidiaSmiProbe"),
        ("nvml", True, True, "NvmlProbe"),
    ],
)
def test_wiring_chooses_nvml_only_on_a_local_host_where_it_starts(
    mode: str,
    local: bool,
    library: bool,
    chosen: str,
    gpus: StandinGpus,
    tmp_path: Path,
    nvml_lib: Path,
    children: list[NvmlChild],
) -> None:
    """auto: NVML on a local host where it initialises, else nvidia-smi; an explicit mode is obeyed."""
    smi_probe(gpus, tmp_path)  # the stand-in nvidia-smi, first on the child's PATH
    children.append(NvmlChild(gpus, nvml_lib if library else None, kind="chosen", mode=mode, local=local, smi=tmp_path))
    holder = gpus.hold([2], 64)
    assert children[-1].chosen() == chosen
    assert [(r["host"], r["probe"]) for r in children[-1].logged() if r["event"] == "gpu_probe_chosen"] == [
        (HOST, "nvml" if chosen == "NvmlProbe" else "nvidia-smi")
    ]
    assert [(p.pid, p.gpu_index, p.used_memory_mib) for p in children[-1].snapshot().processes] == [(holder.pid, 2, 64)]


def test_nvml_required_where_it_cannot_start_is_an_error_naming_host_and_cause(
    gpus: StandinGpus, tmp_path: Path, nvml_lib: Path, children: list[NvmlChild]
) -> None:
    """gpu_probe = "nvml" on a box whose driver is not loaded: GpuProbeError with the host and NVML's error."""
    gpus.set_gpus(driver=False)
    children.append(NvmlChild(gpus, nvml_lib, kind="chosen", mode="nvml"))
    with pytest.raises(GpuProbeError) as err:
        children[-1].chosen()
    assert str(err.value).startswith(f'host {HOST}: gpu_probe = "nvml", but NVML cannot read')
    assert "Driver Not Loaded" in str(err.value)
