"""Handovers under load: the drain host tests' and bench's prober process and event bookkeeping."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parents[2]
TOKENS = 30  # 30 x 20 ms: every stream is in flight for 0.6 s, so each handover has some
ENGINE = ["--load-time", "0.2", "--chunk-delay", "0.02"]
MODELS: dict[str, dict[str, Any]] = {
    "chat-a": {"port": 8101, "served_name": "chat", "gpus": [0, 1, 2, 3], "args": ENGINE},
    "chat-b": {"port": 8102, "served_name": "chat", "gpus": [4, 5, 6, 7], "args": ENGINE},
    "chat-c": {"port": 8103, "served_name": "chat", "gpus": [0, 1, 2, 3], "args": ENGINE},
}


class ProberProcess:
    """tests/proxy_prober.py as a child process; ``requests`` holds its records once it stopped."""

    def __init__(self, url: str, model: str) -> None:
        self.cmd = [
            sys.executable,
            str(REPO / "tests/proxy_prober.py"),
            url,
            model,
            "--streams",
            "4",
            "--plain",
            "2",
            "--tokens",
            str(TOKENS),
        ]
        self.requests: list[dict[str, Any]] = []

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        first: list[str] = []
        reader = threading.Thread(
            target=lambda: first.append(self.proc.stdout.readline() if self.proc.stdout else ""), daemon=True
        )
        reader.start()
        reader.join(timeout=30)
        if first != ["probing\n"]:
            self.proc.kill()
            raise AssertionError(f"the prober never had a good answer from every worker: {first!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        self.requests = json.loads(out)["requests"]


def moves(events: list[tuple[float, str]]) -> list[float]:
    """When the route moved: each `routed` event that changed the proxy's config."""
    return [t for t, e in events if e == "routed"]


def spanning(requests: list[dict[str, Any]], times: list[float]) -> int:
    """Streams that were in flight while the route moved (started before, ended after)."""
    return sum(1 for r in requests if r["kind"] == "stream" and any(r["t0"] < t < r["t1"] for t in times))


def recorder(events: list[tuple[float, str]], drains: list[float]) -> Any:
    def progress(event: str, fields: dict[str, Any]) -> None:
        if event != "routed" or fields.get("changed"):
            events.append((time.monotonic(), event))
        if event == "drained":
            drains.append(float(fields["seconds"]))

    return progress
