"""An HTTP connection over a Unix socket (the dashboard's): the dashboard tests' and benchmarks' client."""

from __future__ import annotations

import http.client
import socket


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 30) -> None:
        super().__init__("dashboard", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)
