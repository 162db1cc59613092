"""The front proxy's deploy.toml and a prober through it: the proxy host tests' and bench's builders."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Self

import httpx

from tests.builders.switch import config_text
from tests.hosts.machine import Host
from tests.hosts.pool import boot_hosts
from tests.hosts.wait import wait_for

PROXY_PORT = 8000
TP4 = {"tensor_parallel": 4}
MODELS: dict[str, dict[str, Any]] = {
    "chat-a": {
        "port": 8101,
        "served_name": "chat",
        "gpus": [0, 1, 2, 3],
        **TP4,
        "args": ["--load-time", "0.3", "--chunk-delay", "0.05"],
    },
    "chat-b": {
        "port": 8102,
        "served_name": "chat",
        "gpus": [4, 5, 6, 7],
        **TP4,
        "args": ["--load-time", "0.3", "--chunk-delay", "0.05"],
    },
    "chat-c": {"port": 8103, "served_name": "chat", "gpus": [0, 1, 2, 3], **TP4, "args": ["--load-time", "1.5"]},
    "code": {"port": 8104, "gpus": [4, 5], "tensor_parallel": 2, "args": ["--load-time", "0.3"]},
}


def proxy_config(host: Host, state: Path, models: dict[str, dict[str, Any]] = MODELS) -> str:
    return config_text(host, state, models) + (
        f"[proxy]\nenabled = true\nport = {PROXY_PORT}\ndrain_timeout_s = 20\nretry_after_s = 2\n"
    )


@contextmanager
def proxy_box(models: dict[str, dict[str, Any]] = MODELS, *, host_keys: str = "") -> Iterator[tuple[Host, Path]]:
    """One booted test host and, in a temporary dir, the proxy's deploy.toml for ``models`` (``host_keys``:
    lines added to its [hosts.NAME]): (the host, the file); the host goes after the block."""
    hosts = boot_hosts(1)
    try:
        host = hosts.hosts[0]
        with tempfile.TemporaryDirectory() as tmp:
            cfg = Path(tmp) / "deploy.toml"
            text = proxy_config(host, Path(tmp) / "state", models)
            cfg.write_text(text.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\n{host_keys}", 1))
            yield host, cfg
    finally:
        hosts.close()


def base_url(host: Host) -> str:
    return f"http://{host.address}:{PROXY_PORT}/v1"


@dataclass
class Prober:
    """A completion through the proxy every 50 ms; records each answer's status (or the error)."""

    url: str
    model: str
    interval: float = 0.05
    answers: list[tuple[float, int | str, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    r = client.post(
                        f"{self.url}/completions", json={"model": self.model, "prompt": "hi", "max_tokens": 2}
                    )
                    self.answers.append((time.monotonic(), r.status_code, r.headers.get("retry-after")))
                except httpx.HTTPError as exc:
                    self.answers.append((time.monotonic(), type(exc).__name__, None))
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))

    def __enter__(self) -> Self:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        wait_for(lambda: len(self.answers), lambda n: n >= 3, what="the first probe answers")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()

    def max_gap(self, status: int = 200) -> float:
        times = [t for t, s, _ in self.answers if s == status]
        return max((b - a for a, b in pairwise(times)), default=0.0)
