"""Both GpuProbe adapters on one stand-in GPU state: the contract tests' and the benchmark's rig.

The state is a $STANDIN_GPU_DIR (gpus.json + one <pid>.json per holder, as the stand-in engine writes
them). NvidiaSmiProbe runs the stand-in nvidia-smi through a LocalShell; NvmlProbe runs in a child
process that finds the stand-in libnvidia-ml.so.1 (tests/standin/fake_nvml.c) the way it finds the
real one, through the dynamic linker (LD_LIBRARY_PATH), since NVML lives in the prober's own process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.errors import GpuProbeError

REPO = Path(__file__).resolve().parents[2]
FAKE_NVML_SOURCE = REPO / "tests" / "standin" / "fake_nvml.c"
STANDIN_NVSMI = REPO / "tests" / "standin" / "nvidia_smi.py"
HOST = "probe-host"  # the name the probes' errors carry


def build_fake_nvml(dest: Path) -> Path:
    """Compile the stand-in NVML into ``dest``/libnvidia-ml.so.1 (its soname, as the driver ships it)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise RuntimeError("gcc is missing: scripts/setup.sh installs it (the NVML stand-in is C)")
    dest.mkdir(parents=True, exist_ok=True)
    lib = dest / "libnvidia-ml.so.1"
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(lib),
            str(FAKE_NVML_SOURCE),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return lib.parent


class StandinGpus:
    """One stand-in GPU state directory and the holder processes registered in it."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "gpu"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []

    def set_gpus(self, count: int = 8, memory_mib: int = 97887, name: str = "Test GPU", **extra: Any) -> None:
        (self.dir / "gpus.json").write_text(
            json.dumps({"count": count, "memory_mib": memory_mib, "name": name, **extra})
        )

    def hold(self, gpus: list[int], mib: int, name: str = "VLLM::EngineCore") -> subprocess.Popen[bytes]:
        """A live process registered as holding ``mib`` on each of ``gpus``, as the stand-in engine does."""
        proc = subprocess.Popen(["sleep", "1000"])
        self.procs.append(proc)
        (self.dir / f"{proc.pid}.json").write_text(
            json.dumps({"pid": proc.pid, "name": name, "gpus": gpus, "mib_per_gpu": mib})
        )
        return proc

    def kill(self, proc: subprocess.Popen[bytes], *, reap: bool = True) -> None:
        """End a holder; its file stays, as a crashed engine's does. ``reap=False`` leaves a zombie."""
        proc.send_signal(signal.SIGKILL)
        if reap:
            proc.wait()
        else:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, still in the table

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def smi_probe(gpus: StandinGpus, tmp: Path) -> NvidiaSmiProbe:
    """The stand-in nvidia-smi on ``gpus``'s state, run through a LocalShell."""
    smi = tmp / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nSTANDIN_GPU_DIR={gpus.dir} exec {sys.executable} -IS {STANDIN_NVSMI} "$@"\n')
    smi.chmod(0o755)
    return NvidiaSmiProbe(LocalShell(HOST), binary=str(smi))


def snapshot_json(snap: GpuSnapshot) -> dict[str, Any]:
    return asdict(snap)


def snapshot_from(data: dict[str, Any]) -> GpuSnapshot:
    return GpuSnapshot(
        gpus=tuple(GpuInfo(**g) for g in data["gpus"]), processes=tuple(GpuProcess(**p) for p in data["processes"])
    )


class NvmlChild:
    """A child process holding one probe (``kind``: "nvml", or "chosen" for wiring's ChosenGpuProbe with
    ``mode``/``local``) over the stand-in NVML in ``lib_dir`` (None: no NVML library at all); ``smi``: the
    folder whose nvidia-smi a chosen probe falls back to (smi_probe's wrapper)."""

    def __init__(
        self,
        gpus: StandinGpus,
        lib_dir: Path | None,
        *,
        kind: str = "nvml",
        mode: str = "auto",
        local: bool = True,
        smi: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        child_env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        child_env |= {"STANDIN_GPU_DIR": str(gpus.dir), "PYTHONPATH": str(REPO), **(env or {})}
        if lib_dir is not None:
            child_env["LD_LIBRARY_PATH"] = str(lib_dir)
        if smi is not None:
            child_env["PATH"] = f"{smi}:{child_env.get('PATH', '/usr/bin:/bin')}"
        argv = [sys.executable, "-m", "tests.builders.gpu_probe_child", kind, mode, "local" if local else "ssh"]
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in close(), with the child)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=child_env, cwd=REPO, text=True
        )

    def logged(self) -> list[dict[str, Any]]:
        """The child's log lines so far (structlog's JSON)."""
        self.log.seek(0)
        return [json.loads(line) for line in self.log.read().splitlines() if line.startswith("{")]

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            if answer["error"] != "GpuProbeError":
                raise RuntimeError(f"probe child: {answer['error']}: {answer['message']}")
            raise GpuProbeError(answer["message"])
        return answer

    def snapshot(self) -> GpuSnapshot:
        return snapshot_from(self.ask("snapshot")["snapshot"])

    def chosen(self) -> str:
        """The class name of the probe a "chosen" child settled on."""
        return str(self.ask("chosen")["chosen"])

    def bench(self, calls: int) -> list[float]:
        """Wall seconds of ``calls`` snapshots, timed inside the child."""
        return [float(t) for t in self.ask(f"bench {calls}")["seconds"]]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.log.close()
