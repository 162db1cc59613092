"""GpuProbe: nvidia-smi (or the test hosts' stand-in) run through a host's Shell."""

from __future__ import annotations

from orchestrator.core import nvsmi
from orchestrator.core.observed import GpuSnapshot
from orchestrator.errors import CommandFailed, OrchestratorError
from orchestrator.ports import Shell


class GpuProbeError(OrchestratorError):
    """nvidia-smi could not be run or answered with an error (driver gone, bad field)."""


class NvidiaSmiProbe:
    """Both CSV queries, parsed into one snapshot; a read-only command, so retried on a drop."""

    def __init__(self, shell: Shell, binary: str = "nvidia-smi", timeout: float = 30.0) -> None:
        self.shell = shell
        self.binary = binary
        self.timeout = timeout

    def _query(self, args: list[str]) -> str:
        try:
            return self.shell.run([self.binary, *args], timeout=self.timeout, idempotent=True).stdout
        except CommandFailed as exc:
            detail = exc.output.strip().splitlines()
            raise GpuProbeError(f"{self.binary} {args[0]} exited {exc.returncode}"
                                + (f": {detail[0]}" if detail else ""), host=self.shell.host) from exc

    def snapshot(self) -> GpuSnapshot:
        gpus = nvsmi.parse_gpus(self._query(nvsmi.gpu_query()))
        apps = nvsmi.parse_apps(self._query(nvsmi.apps_query()), gpus)
        return GpuSnapshot(gpus=gpus, processes=apps)
