"""Which GpuProbe a host gets: NVML in the agent's own process where it can, nvidia-smi elsewhere.

NVML reads the machine it runs in, so only a host whose transport is "local" (the agent on its own
box) can use it; over SSH, or where NVML does not initialise (no driver, no libnvidia-ml.so.1, a test
host's stand-in nvidia-smi), nvidia-smi runs through the host's shell. The choice is made once per
host, on the first snapshot, so a command that never reads the GPUs never loads NVML (whose start
takes up to seconds on a box without the persistence daemon), and it is logged.
"""

from __future__ import annotations

import threading
from typing import Literal

from orchestrator import logs
from orchestrator.adapters.nvidia_smi import NvidiaSmiProbe
from orchestrator.adapters.nvml import NvmlProbe
from orchestrator.core.observed import GpuSnapshot
from orchestrator.errors import GpuProbeError
from orchestrator.ports import GpuProbe, Shell

Mode = Literal["auto", "nvml", "nvidia-smi"]


class ChosenGpuProbe:
    """A host's GpuProbe, chosen on first use by ``mode`` (the host's ``gpu_probe``) and ``local``:
    "nvidia-smi" always runs it; "nvml" is NVML or a GpuProbeError naming the host and NVML's error;
    "auto" is NVML on a local host where it initialises, else nvidia-smi."""

    def __init__(
        self, shell: Shell, *, mode: Mode = "auto", local: bool = False, nvml: NvmlProbe | None = None
    ) -> None:
        self.shell = shell
        self.mode = mode
        self.local = local
        self._nvml = nvml or NvmlProbe(shell.host)
        self._lock = threading.Lock()
        self._chosen: GpuProbe | None = None

    def chosen(self) -> GpuProbe:
        """The probe this host uses, chosen on the first call."""
        if self._chosen is None:
            with self._lock:
                if self._chosen is None:
                    self._chosen = self._choose()
        return self._chosen

    def _choose(self) -> GpuProbe:
        log = logs.get_logger().bind(host=self.shell.host, gpu_probe=self.mode)
        if self.mode == "nvidia-smi" or (self.mode == "auto" and not self.local):
            reason = "configured" if self.mode == "nvidia-smi" else "remote host"
            log.info("gpu_probe_chosen", probe="nvidia-smi", reason=reason)
            return NvidiaSmiProbe(self.shell)
        try:
            self._nvml.start()
            self._nvml.snapshot()  # every call the probe makes, once: a driver too old for one shows now
        except GpuProbeError as exc:
            if self.mode == "nvml":
                raise GpuProbeError(
                    f'gpu_probe = "nvml", but NVML cannot read this host\'s GPUs: {exc.message}', host=self.shell.host
                ) from exc
            log.info("gpu_probe_chosen", probe="nvidia-smi", reason=f"NVML unavailable: {exc.message}")
            return NvidiaSmiProbe(self.shell)
        log.info("gpu_probe_chosen", probe="nvml", reason="configured" if self.mode == "nvml" else "local host")
        return self._nvml

    def snapshot(self) -> GpuSnapshot:
        return self.chosen().snapshot()
