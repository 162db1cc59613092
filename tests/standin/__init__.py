"""A stand-in for a vLLM OpenAI-compatible server, for fault tests and benchmarks (stdlib only).

``StandinServer`` runs ``openai_server.py`` as a local process on loopback for tests:

    s = StandinServer("--served-name", "tiny", "--load-time", "1").wait_listening()
    httpx.get(s.url + "/health"); s.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Self

SERVER = Path(__file__).with_name("openai_server.py")


class StandinServer:
    """One server process; ``port`` is known once it prints that it listens (``--port 0`` default)."""

    def __init__(
        self,
        *args: str,
        host: str = "127.0.0.1",
        port: int = 0,
        env: dict[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        if "--served-name" not in args:
            args = ("--served-name", "tiny-standin", *args)
        self.host = host
        self.port = port
        self.proc = subprocess.Popen(
            [python, str(SERVER), "--host", host, "--port", str(port), *args],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.stderr: list[str] = []
        self.listening = threading.Event()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            if " listening on " in line:
                self.port = int(line.split(" listening on ")[1].split()[0].rsplit(":", 1)[1])
                self.listening.set()

    def wait_listening(self, timeout: float = 15.0) -> Self:
        if not self.listening.wait(timeout):
            raise AssertionError(f"stand-in server did not listen within {timeout}s: {''.join(self.stderr)}")
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
