"""GpuProbe: NVML, NVIDIA's own library (nvidia-ml-py's pynvml), in the agent's own process.

One call per GPU and one process list per GPU, microseconds each, where nvidia-smi costs a process
(tens of milliseconds, and more on a loaded box). NVML reads the machine it runs on, so only a host
whose transport is "local" uses it (orchestrator.adapters.gpu_choice). The figures are nvidia-smi's:
MiB as bytes // 2**20, memory from the v2 struct (its used memory leaves out the driver's reserve,
as nvidia-smi's memory.used does; v1 on a driver without it), a process whose memory NVML cannot
tell holds 0 MiB (nvidia-smi's [N/A]), its name as NVML names it (argv[0], what nvidia-smi prints).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.errors import GpuProbeError

_MIB = 1 << 20
_UNAVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong


def mib(value: int | None) -> int:
    """Bytes as nvidia-smi's MiB (floor); None or NVML's "not available" read as 0."""
    return 0 if value is None or value == _UNAVAILABLE else int(value) // _MIB


def proc_name(pid: int, proc: str = "/proc") -> str:
    """A process's name where NVML cannot give it: argv[0] (the name an engine's worker
    process sets for itself), else its comm; "" once it is gone."""
    for name, sep in (("cmdline", b"\0"), ("comm", b"\n")):
        try:
            with open(f"{proc}/{pid}/{name}", "rb") as f:
                first = f.read(4096).split(sep, 1)[0]
        except OSError:
            continue
        if first:
            return first.decode(errors="replace")
    return ""


class NvmlProbe:
    """NVML in this process: initialised once, on first use (thread-safe), never shut down."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._nvml: Any = None  # the pynvml module once NVML is initialised
        self._memory_v2 = True

    def start(self) -> None:
        """Load and initialise NVML, once; GpuProbeError naming the host and NVML's error when the
        library is missing or the driver does not answer."""
        if self._nvml is not None:
            return
        with self._lock:
            if self._nvml is not None:
                return
            try:
                import pynvml
            except ImportError as exc:  # an install without the dependency
                raise GpuProbeError(f"NVML: nvidia-ml-py is not installed ({exc})", host=self.host) from exc
            self._call(pynvml, "nvmlInit", pynvml.nvmlInit)
            self._nvml = pynvml

    def _call(self, nvml: Any, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            raise GpuProbeError(f"NVML {what}: {exc} (NVML error {code})", host=self.host) from exc
        except nvml.NVMLLibraryMismatchError as exc:  # a library older than the binding
            raise GpuProbeError(f"NVML {what}: {exc}", host=self.host) from exc

    def _memory(self, nvml: Any, index: int, handle: Any) -> tuple[int, int]:
        if self._memory_v2:
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                return mib(mem.total), mib(mem.used)
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported):
                self._memory_v2 = False  # a driver before v2 (R510): v1 from now on
            except nvml.NVMLError as exc:
                raise GpuProbeError(f"NVML nvmlDeviceGetMemoryInfo_v2 (GPU {index}): {exc}", host=self.host) from exc
        mem = self._call(nvml, f"nvmlDeviceGetMemoryInfo (GPU {index})", nvml.nvmlDeviceGetMemoryInfo, handle)
        return mib(mem.total), mib(mem.used)

    def _name(self, nvml: Any, pid: int) -> str:
        try:
            return str(nvml.nvmlSystemGetProcessName(pid))
        except nvml.NVMLError:  # gone since the list, or not ours to read (containers)
            return proc_name(pid)

    def snapshot(self) -> GpuSnapshot:
        self.start()
        nv = self._nvml
        gpus: list[GpuInfo] = []
        procs: list[GpuProcess] = []
        for index in range(int(self._call(nv, "nvmlDeviceGetCount", nv.nvmlDeviceGetCount))):
            handle = self._call(nv, f"nvmlDeviceGetHandleByIndex({index})", nv.nvmlDeviceGetHandleByIndex, index)
            uuid = str(self._call(nv, f"nvmlDeviceGetUUID (GPU {index})", nv.nvmlDeviceGetUUID, handle))
            name = str(self._call(nv, f"nvmlDeviceGetName (GPU {index})", nv.nvmlDeviceGetName, handle))
            total, used = self._memory(nv, index, handle)
            gpus.append(GpuInfo(index=index, uuid=uuid, name=name, memory_total_mib=total, memory_used_mib=used))
            running = self._call(
                nv,
                f"nvmlDeviceGetComputeRunningProcesses (GPU {index})",
                nv.nvmlDeviceGetComputeRunningProcesses,
                handle,
            )
            procs += [
                GpuProcess(
                    pid=int(p.pid),
                    process_name=self._name(nv, int(p.pid)),
                    gpu_uuid=uuid,
                    used_memory_mib=mib(p.usedGpuMemory),
                    gpu_index=index,
                )
                for p in running
            ]
        return GpuSnapshot(gpus=tuple(gpus), processes=tuple(procs))
