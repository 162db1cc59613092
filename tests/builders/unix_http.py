"""An HTTP connection over a Unix socket (the dashboard's): the dashboard tests' and benchmarks' client."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Callable


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30) -> None:
        super().__init__("dashboard", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def sse_marks(
    path: str,
    url: str,
    start: Callable[[], object],
    first: Callable[[dict[str, str]], bool],
    last: Callable[[dict[str, str]], bool],
) -> tuple[float, float]:
    """Follow the dashboard's event stream ``url`` on the socket at ``path``; once its first message came,
    call ``start``; then (ms to the first message whose fragments ``first`` accepts, ms to the one ``last``
    accepts; the first is the last's when none showed before it)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        stream = s.makefile("rb")
        for line in stream:  # the headers, then the message sent on connecting
            if line.startswith(b"data: "):
                break
        t0 = time.perf_counter()
        start()
        seen: float | None = None
        for line in stream:
            if not line.startswith(b"data: "):
                continue
            html = json.loads(line[6:])["html"]
            now = (time.perf_counter() - t0) * 1000
            if seen is None and first(html):
                seen = now
            if last(html):
                return (seen if seen is not None else now), now
    finally:
        s.close()
    raise AssertionError(f"{url} ended before the last mark")
