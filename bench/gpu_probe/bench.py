#!/usr/bin/env python3
"""What one GPU snapshot costs: NvidiaSmiProbe (a process per snapshot) against NvmlProbe (NVML in the
agent's process), median and p99 wall time over N snapshots each.

Stand-in (default): 8 GPUs of 143,771 MiB, a TP=4 engine, a TP=2 one and a worker holding memory (the
freeing step's usual picture); nvidia-smi is the stand-in script (a Python process, ~20 ms of CPU, where the
real one is a C program), NVML the stand-in libnvidia-ml.so.1 (tests/standin/fake_nvml.c, which re-reads
its state files on every call where the driver answers from memory). Both answer the same state, and the
two snapshots are checked equal before timing.

--real: the machine's own nvidia-smi and driver (a GPU box), both probes in this process; the two
snapshots are printed side by side (they should agree but for memory that moved between the reads), with
NVML's v1 and v2 memory figures of each GPU (nvidia-smi's memory.used leaves out the driver's reserve, as
v2 does). --hold-gib N: a torch process holds N GiB on GPU 0 meanwhile (a process to list by PID).

    .venv/bin/python bench/gpu_probe/bench.py [--calls 200] [--real [--hold-gib 20]]
    (raw: bench/gpu_probe/bench.txt; the H200's: bench/gpu_probe/h200.txt)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.adapters.nvml import NvmlProbe
from orchestrator.core.observed import GpuSnapshot


def timed(snapshot: Callable[[], GpuSnapshot], calls: int) -> list[float]:
    seconds = []
    for _ in range(calls):
        t0 = time.perf_counter()
        snapshot()
        seconds.append(time.perf_counter() - t0)
    return seconds


def figures(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return f"{name:<34} {len(ms):>5} {statistics.median(ms):>10.3f} {p99:>10.3f} {ms[0]:>9.3f} {ms[-1]:>9.3f}"


HEADER = f"{'probe':<34} {'calls':>5} {'median ms':>10} {'p99 ms':>10} {'min ms':>9} {'max ms':>9}"


def describe(snap: GpuSnapshot) -> str:
    gpus = ", ".join(f"{g.index}:{g.memory_used_mib}/{g.memory_total_mib}" for g in snap.gpus)
    procs = ", ".join(f"{p.pid} {p.process_name} gpu{p.gpu_index} {p.used_memory_mib}" for p in snap.processes)
    return f"GPUs (MiB used/total) {gpus or '-'}; processes {procs or '-'}"


def standin(calls: int) -> None:
    from tests.builders.gpu_probes import NvmlChild, StandinGpus, build_fake_nvml, smi_probe

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        gpus = StandinGpus(root)
        children: list[NvmlChild] = []
        try:
            gpus.set_gpus(count=8, memory_mib=143771, name="NVIDIA H200")
            gpus.hold([0, 1, 2, 3], 122666)
            gpus.hold([4, 5], 60000)
            gpus.hold([5], 1536, name="VLLM::Worker_TP1")
            smi = smi_probe(gpus, root)
            nvml = NvmlChild(gpus, build_fake_nvml(root / "lib"))
            children.append(nvml)
            snap = smi.snapshot()
            assert nvml.snapshot() == snap, "the two probes disagree on the stand-in state"
            print(f"state: {describe(snap)}")
            print(HEADER)
            timed(smi.snapshot, 5)
            print(figures("NvidiaSmiProbe (stand-in script)", timed(smi.snapshot, calls)))
            nvml.bench(20)
            print(figures("NvmlProbe (stand-in library)", nvml.bench(calls)))
        finally:
            for child in children:
                child.close()
            gpus.close()


HOLD = """import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
print("held", flush=True)
time.sleep(600)
"""


def memory_versions() -> None:
    import pynvml

    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        v1, v2 = pynvml.nvmlDeviceGetMemoryInfo(h), pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        print(
            f"GPU {i} NVML bytes: v1 total {v1.total} used {v1.used} free {v1.free}; v2 total {v2.total} "
            f"reserved {v2.reserved} used {v2.used} free {v2.free}; MiB v1 {v1.used >> 20}/{v1.total >> 20} "
            f"v2 {v2.used >> 20}/{v2.total >> 20}"
        )


def real(calls: int, hold_gib: float) -> None:
    holder = None
    if hold_gib:
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(hold_gib)], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held", "the torch holder failed"
    try:
        real_probes(calls)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


def real_probes(calls: int) -> None:
    smi, nvml = NvidiaSmiProbe(LocalShell("bench")), NvmlProbe("bench")
    t0 = time.perf_counter()
    nvml.start()
    print(f"NVML start (load + nvmlInit, once per agent): {1000 * (time.perf_counter() - t0):.1f} ms")
    a, b = smi.snapshot(), nvml.snapshot()
    print(f"nvidia-smi: {describe(a)}")
    print(f"NVML:       {describe(b)}")
    print(f"equal snapshots: {a == b}")
    # The H200 gave 86,917 MiB used by nvidia-smi and 86,916 by NVML (v2: 86,916.25) with equal processes:
    # the GPU's total moves by a MiB between two reads, or the two round it apart.
    diff = max((abs(x.memory_used_mib - y.memory_used_mib) for x, y in zip(a.gpus, b.gpus, strict=False)), default=0)
    print(f"equal processes: {a.processes == b.processes}; GPU used MiB apart by at most {diff}")
    memory_versions()
    print(HEADER)
    timed(smi.snapshot, 3)
    print(figures("NvidiaSmiProbe (nvidia-smi)", timed(smi.snapshot, calls)))
    timed(nvml.snapshot, 20)
    print(figures("NvmlProbe (libnvidia-ml)", timed(nvml.snapshot, calls)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--real", action="store_true", help="this machine's nvidia-smi and NVML")
    ap.add_argument("--hold-gib", type=float, default=0.0, help="--real: a torch process holds this on GPU 0")
    a = ap.parse_args()
    print(
        f"# bench/gpu_probe/bench.py --calls {a.calls}{' --real' if a.real else ''}: "
        f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
    )
    if a.real:
        real(a.calls, a.hold_gib)
    else:
        standin(a.calls)


if __name__ == "__main__":
    main()
