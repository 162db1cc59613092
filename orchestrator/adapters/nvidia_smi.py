"""GpuProbe: nvidia-smi (or the test hosts' stand-in) run through a host's Shell."""

from __future__ import annotations

import shlex

from orchestrator.core import nvsmi
from orchestrator.core.observed import GpuSnapshot
from orchestrator.errors import CommandFailed, GpuProbeError
from orchestrator.ports import Shell

__all__ = ["GpuProbeError", "NvidiaSmiProbe"]

_SEPARATOR = "--orchestrator-nvidia-smi-apps--"


class NvidiaSmiProbe:
    """Both CSV queries, parsed into one snapshot; a read-only command, so retried on a drop."""

    def __init__(self, shell: Shell, binary: str = "nvidia-smi", timeout: float = 30.0) -> None:
        self.shell = shell
        self.binary = binary
        self.timeout = timeout

    def _query(self, argv: list[str], what: str) -> str:
        try:
            return self.shell.run(argv, timeout=self.timeout, idempotent=True).stdout
        except CommandFailed as exc:
            detail = [line for line in exc.output.strip().splitlines() if line != _SEPARATOR]
            raise GpuProbeError(
                f"{self.binary} {what} exited {exc.returncode}" + (f": {detail[0]}" if detail else ""),
                host=self.shell.host,
            ) from exc

    def snapshot(self) -> GpuSnapshot:
        # Both queries in one round trip: the freeing step polls this several times a second.
        joined = " && ".join(
            [
                shlex.join([self.binary, *nvsmi.gpu_query()]),
                f"echo {_SEPARATOR}",
                shlex.join([self.binary, *nvsmi.apps_query()]),
            ]
        )
        out = self._query(["sh", "-c", joined], what="query")
        gpu_text, _, apps_text = out.partition(f"{_SEPARATOR}\n")
        gpus = nvsmi.parse_gpus(gpu_text)
        return GpuSnapshot(gpus=gpus, processes=nvsmi.parse_apps(apps_text, gpus))
