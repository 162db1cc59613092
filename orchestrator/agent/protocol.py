"""The control socket's wire format: one JSON object per line, both ways.

Request:  {"op": "switch", "args": {...}}
Replies:  {"event": NAME, "fields": {...}}  (any number, while the operation runs)
          {"result": ...}  or  {"error": {"type": T, "message": M, "exit_code": N}}  (exactly one, last)
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from orchestrator import errors
from orchestrator.errors import OrchestratorError

# One request line at most (the README's figure): a deploy.toml sent by `config push` must fit.
MAX_REQUEST = 64 * 1024


def encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def error_reply(exc: OrchestratorError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}}


def raise_error(payload: dict[str, Any]) -> None:
    """Re-raise an error reply as the same project error type on the client side."""
    cls = getattr(errors, str(payload.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, OrchestratorError)):
        cls = errors.AgentError
    exc = OrchestratorError.__new__(cls)
    OrchestratorError.__init__(exc, str(payload.get("message")))
    exc.exit_code = int(payload.get("exit_code", 1))
    raise exc


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
