"""Models on demand on a test host: the deploy.toml and a client-side prober through the proxy (the
acceptance host tests' and bench/on_demand.py's builders)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx

from tests.builders.proxy import base_url, proxy_config
from tests.hosts.machine import Host

# The acceptance's stand-in: cold load 2 s, wake 0.3 s (sleep mode, level 1).
ENGINE = ["--load-time", "2", "--wake-time", "0.3", "--sleep-time", "0.1", "--chunk-delay", "0.02"]
# demand_deadline_s: a warm swap here is the displaced model's drain and sleep, the check and the wake
# (3-5 s on this loaded 2-core machine), longer than the default (wake_deadline_s + batch_wait_s).
ON_DEMAND: dict[str, Any] = {
    "sleep": "level1",
    "on_demand": True,
    "wake_deadline_s": 5,
    "demand_deadline_s": 30,
    "args": ENGINE,
}
LOW = [0, 1, 2, 3]
HIGH = [4, 5, 6, 7]
# alpha and beta share GPU 0-3: serving one means the other sleeps; gamma (GPU 4-7) never came up.
AB: dict[str, dict[str, Any]] = {
    "alpha": {"port": 8141, "gpus": LOW, **ON_DEMAND},
    "beta": {"port": 8142, "gpus": LOW, **ON_DEMAND},
    "gamma": {"port": 8143, "gpus": HIGH, **ON_DEMAND},
}
# Five models on a box that fits two at once (4 of its 8 GPUs each).
FLOOD: dict[str, dict[str, Any]] = {
    f"f{i}": {"port": 8150 + i, "gpus": LOW if i % 2 else HIGH, **ON_DEMAND} for i in range(1, 6)
}


def demand_config(
    host: Host,
    state: Path,
    models: dict[str, dict[str, Any]],
    *,
    max_swaps_per_min: int,
    batch_wait_s: float,
    transport: str = "local",
    proxy_user: str | None = None,
) -> str:
    """``proxy_user``: the account HAProxy's workers drop to ([proxy] user; None: they stay root)."""
    text = proxy_config(host, state, models).replace('transport = "ssh"', f'transport = "{transport}"', 1)
    if proxy_user is not None:
        text = text.replace("[proxy]\n", f'[proxy]\nuser = "{proxy_user}"\n', 1)
    text = text.replace(f"[hosts.{host.name}]\n", f"[hosts.{host.name}]\nsleep_ram_gib = 16\n", 1)
    return text + f"[demand]\nmax_swaps_per_min = {max_swaps_per_min}\nbatch_wait_s = {batch_wait_s}\n"


@dataclass
class Answer:
    model: str
    t0: float
    t1: float
    status: int | str  # the HTTP status, or the exception's name
    retry_after: str | None
    tokens: int = 0
    w0: float = 0.0  # wall clock (time.time()) of t0, to compare with the agent's records

    @property
    def wait(self) -> float:
        return self.t1 - self.t0

    @property
    def w1(self) -> float:
        return self.w0 + self.wait

    @property
    def failed(self) -> bool:
        """Anything but a 200 or a 429 that says when to retry."""
        return self.status != 200 and not (self.status == 429 and self.retry_after)


@dataclass
class Client:
    """One client through the proxy: completions for ``models`` in turn, one at a time, until stopped
    (or ``rounds`` requests); every answer recorded."""

    url: str
    models: list[str]
    rounds: int | None = None
    max_tokens: int = 2
    timeout: float = 60.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            i = 0
            while not self._stop.is_set() and (self.rounds is None or i < self.rounds):
                model = self.models[i % len(self.models)]
                i += 1
                t0, w0 = time.monotonic(), time.time()
                body = {"model": model, "prompt": "hi", "max_tokens": self.max_tokens}
                try:
                    r = client.post(f"{self.url}/completions", json=body)
                    tokens = (r.json().get("usage") or {}).get("completion_tokens", 0) if r.status_code == 200 else 0
                    self.answers.append(
                        Answer(model, t0, time.monotonic(), r.status_code, r.headers.get("retry-after"), tokens, w0)
                    )
                except (httpx.HTTPError, ValueError) as exc:
                    self.answers.append(Answer(model, t0, time.monotonic(), type(exc).__name__, None, w0=w0))

    def __enter__(self) -> Self:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


def url(host: Host) -> str:
    return base_url(host)
