"""One GpuProbe in its own process, answering lines on stdin with JSON lines (tests.builders.gpu_probes).

argv: KIND ("nvml" | "chosen") MODE ("auto" | "nvml" | "nvidia-smi") TRANSPORT ("local" | "ssh"); a chosen
probe that falls back runs the nvidia-smi on PATH. Commands: "snapshot", "chosen", "bench N".
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from orchestrator import logs
from orchestrator.adapters.gpu_choice import ChosenGpuProbe, Mode
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.adapters.nvml import NvmlProbe
from orchestrator.errors import OrchestratorError
from orchestrator.ports import GpuProbe
from tests.builders.gpu_probes import HOST, snapshot_json


def main(kind: str, mode: str, transport: str) -> None:
    logs.configure(json=True, level=logging.INFO)  # JSON lines on stderr, as the agent logs
    probe: GpuProbe
    chosen: ChosenGpuProbe | None = None
    if kind == "nvml":
        probe = NvmlProbe(HOST)
    else:
        modes: dict[str, Mode] = {"auto": "auto", "nvml": "nvml", "nvidia-smi": "nvidia-smi"}
        chosen = probe = ChosenGpuProbe(LocalShell(HOST), mode=modes[mode], local=transport == "local")
    for line in sys.stdin:
        command, *args = line.split()
        answer: dict[str, Any]
        try:
            if command == "snapshot":
                answer = {"snapshot": snapshot_json(probe.snapshot())}
            elif command == "chosen" and chosen is not None:
                answer = {"chosen": type(chosen.chosen()).__name__}
            elif command == "bench":
                seconds = []
                for _ in range(int(args[0])):
                    t0 = time.perf_counter()
                    probe.snapshot()
                    seconds.append(time.perf_counter() - t0)
                answer = {"seconds": seconds}
            else:
                answer = {"error": "UsageError", "message": f"unknown command {line.strip()!r}"}
        except OrchestratorError as exc:
            answer = {"error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
