"""The outside view of a switch: clients that ask every serving port for a completion every 50 ms.

One thread per URL, each on its own fresh connection per request (a client that reconnects), so a
closed listener shows at once as a refused connection. A "good answer" is HTTP 200 to a 1-token
completion naming that port's model. Downtime of a switch = the longest gap between consecutive
good answers, from any URL, inside the switch's time window.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Self


@dataclass(frozen=True)
class Target:
    address: str
    port: int
    model: str


@dataclass
class Prober:
    targets: list[Target]
    interval: float = 0.05
    timeout: float = 1.0
    good: list[tuple[float, float]] = field(default_factory=list)  # (sent, answered), monotonic
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Self:
        for t in self.targets:
            th = threading.Thread(target=self._loop, args=(t,), name=f"probe-{t.port}", daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=5)

    def _loop(self, target: Target) -> None:
        body = json.dumps({"model": target.model, "prompt": "ping", "max_tokens": 1}).encode()
        next_at = time.monotonic()
        while not self._stop.is_set():
            sent = time.monotonic()
            ok = _ask(target, body, self.timeout)
            now = time.monotonic()
            with self._lock:
                self.sent += 1
                if ok:
                    self.good.append((sent, now))
            next_at += self.interval
            next_at = max(next_at, now)  # after a slow answer (timeout) probe again at once
            self._stop.wait(next_at - now)

    def serving(self, since: float) -> bool:
        """Whether a request sent at or after ``since`` got a good answer."""
        with self._lock:
            return any(sent >= since for sent, _ in self.good[-len(self.targets) * 4 :])

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Block until a request sent after this call gets a good answer."""
        t0 = time.monotonic()
        while not self.serving(t0):
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"no good answer from {self.targets} within {timeout:g} s")
            time.sleep(0.02)

    def downtime(self, start: float, end: float) -> tuple[float, float, float]:
        """(gap seconds, last good before, first good after) for the longest gap in [start, end]."""
        with self._lock:
            times = sorted(answered for _, answered in self.good)
        before = [t for t in times if t <= start]
        inside = [t for t in times if start < t <= end]
        series = before[-1:] + inside
        if len(series) < 2:
            raise RuntimeError(
                f"probe saw no answer on one side of the switch window ({len(before)} "
                f"good answers before, {len(inside)} inside)"
            )
        gaps = [(b - a, a, b) for a, b in pairwise(series)]
        return max(gaps)


def _ask(target: Target, body: bytes, timeout: float) -> bool:
    conn = http.client.HTTPConnection(target.address, target.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
