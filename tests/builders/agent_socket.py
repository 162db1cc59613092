"""A Unix socket that answers each request the way an agent would, from a table of replies, and records
the operation of each request: for CLI tests that must reach "an agent" without starting one."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any


class StandInAgent:
    """Listens on ``path``; a request for op X gets ``{"result": replies[X]}`` (None for an op not in the table)."""

    def __init__(self, path: Path, replies: dict[str, Any]) -> None:
        self.ops: list[str] = []
        self.replies = replies
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as stream:
                op = json.loads(stream.readline())["op"]
                self.ops.append(op)
                conn.sendall((json.dumps({"result": self.replies.get(op)}) + "\n").encode())
