"""The agent's own cost: resident memory and CPU time of its process, read from /proc."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Self

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the process (all its threads) and of children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / TICK


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"pid {pid}: no {key} in /proc/{pid}/status")


@dataclass
class Window:
    seconds: float
    cpu_s: float
    rss_min_mib: float
    rss_max_mib: float


class Sampler:
    """Samples RSS every 0.1 s between start() and stop(); CPU time is the difference of the ends."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.rss.append(rss_mib(self.pid))
            self._stop.wait(0.1)

    def __enter__(self) -> Self:
        self._t0, self._cpu0 = time.monotonic(), cpu_seconds(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.rss.append(rss_mib(self.pid))
        self.window = Window(
            time.monotonic() - self._t0, cpu_seconds(self.pid) - self._cpu0, min(self.rss), max(self.rss)
        )
