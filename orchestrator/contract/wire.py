"""The agent's wire: one JSON object per line, both ways, on its Unix socket or an SSH relay channel.

Request:  {"op": "switch", "args": {...}}
Replies:  {"event": NAME, "fields": {...}}  (any number, while the operation runs)
          {"result": ...}  or  {"error": {"type": T, "message": M, "exit_code": N}}  (exactly one, last)
"""

from __future__ import annotations

import json
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import errors
from orchestrator.errors import AgentError, OrchestratorError

# One request line at most (docs/reference/agent.md's figure): a deploy.toml sent by `config push` must fit.
MAX_REQUEST = 64 * 1024

# The error types a reply may name: every project error, so the client raises the agent's own type
# (and exit code); any other name reads as an AgentError.
ERROR_TYPES: dict[str, type[OrchestratorError]] = {
    name: cls for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, OrchestratorError)
}


def socket_path(state_dir: str) -> str:
    """Where the agent listens: $ORCHESTRATOR_SOCKET, else agent.sock in the state dir."""
    return os.environ.get("ORCHESTRATOR_SOCKET") or str(Path(state_dir) / "agent.sock")


def encode(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def request(op: str, args: dict[str, Any]) -> bytes:
    return encode({"op": op, "args": args})


def error_reply(exc: OrchestratorError) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc), "exit_code": exc.exit_code}}


def error_of(payload: dict[str, Any]) -> OrchestratorError:
    """An error reply as the same project error type on the client side (its message and exit code)."""
    cls = ERROR_TYPES.get(str(payload.get("type")), AgentError)
    exc = OrchestratorError.__new__(cls)
    OrchestratorError.__init__(exc, str(payload.get("message")))
    exc.exit_code = int(payload.get("exit_code", 1))
    return exc


def raise_error(payload: dict[str, Any]) -> None:
    raise error_of(payload)


@dataclass(frozen=True)
class Event:
    name: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """The last line of an answer: the result, or the error the agent answered."""

    result: Any = None
    error: OrchestratorError | None = None

    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


class ReplyReader:
    """Reads an answer as its bytes arrive (whole or in pieces): events, then one Reply."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.reply: Reply | None = None

    def feed(self, data: bytes) -> list[Event]:
        """The events complete in what arrived so far; ``reply`` is set once the last line is in."""
        self._buf += data
        events: list[Event] = []
        while self.reply is None and b"\n" in self._buf:
            line, _, rest = bytes(self._buf).partition(b"\n")
            self._buf[:] = rest
            msg = json.loads(line)
            if "event" in msg:
                events.append(Event(str(msg["event"]), dict(msg.get("fields") or {})))
            elif "error" in msg:
                self.reply = Reply(error=error_of(msg["error"]))
            else:
                self.reply = Reply(result=msg.get("result"))
        return events


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid
