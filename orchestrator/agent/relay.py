"""The relay a remote CLI runs on the box over SSH: stdin -> agent socket, agent socket -> stdout.

Like ``docker system dial-stdio``: a byte pipe that knows nothing of the protocol, so the CLI
speaks to the agent exactly as a local client would. It imports nothing heavy (it starts once
per command). Who is on the other end is not the relay's to say: the agent reads it from the
socket peer's credentials (the SSH login's uid) and that process's SSH_CONNECTION.

    python -m orchestrator.agent.relay [--socket PATH] [--config PATH]

Exit codes: 0 when the agent closed the stream, 6 when there is no agent to reach (one line on
stderr naming the socket and why).
"""

from __future__ import annotations

import os
import socket
import sys
import threading

DEFAULT_CONFIG = "/etc/orchestrator/deploy.toml"
AGENT_UNREACHABLE = 6
_CHUNK = 65536


def default_socket(config: str | None = None) -> str:
    """$ORCHESTRATOR_SOCKET, else <state_dir>/agent.sock of the box's deploy.toml (read cheaply)."""
    # The CLI's own cheap read (no catalog); a file it cannot read plainly: the default place, and a
    # wrong socket is reported below. Imported here: a CLI or controller that names the socket (each
    # request of theirs is one relay start) does not pay for the settings module and its imports.
    from orchestrator import settings
    from orchestrator.contract.wire import socket_path

    peeked = settings.peek(config or os.environ.get("ORCHESTRATOR_CONFIG") or DEFAULT_CONFIG)
    return socket_path(peeked.state_dir if peeked is not None else settings.DEFAULT_STATE_DIR)


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        reason = (
            "no agent is running there"
            if isinstance(exc, FileNotFoundError | ConnectionRefusedError)
            else exc.strerror or str(exc)
        )
        raise ConnectionError(f"agent socket {path}: {reason}") from exc
    return sock


def _pump_in(sock: socket.socket, stdin: int) -> None:
    """stdin -> socket; at EOF, half-close so the agent sees the end of the request stream."""
    try:
        while data := os.read(stdin, _CHUNK):
            sock.sendall(data)
    except OSError:
        pass  # the agent went away: the other direction notices and ends the relay
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def pipe(sock: socket.socket, stdin: int, stdout: int) -> None:
    """Copy both ways until the agent closes; a vanished client (stdout broken) ends it too."""
    threading.Thread(target=_pump_in, args=(sock, stdin), daemon=True).start()
    try:
        while data := sock.recv(_CHUNK):
            view = memoryview(data)
            while view:
                view = view[os.write(stdout, view) :]
    except OSError:
        pass  # the SSH client is gone (EPIPE) or the agent reset: either way the relay ends
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    opts: dict[str, str] = {}
    while args:
        flag = args.pop(0)
        if flag not in ("--socket", "--config") or not args:
            print(f"usage: relay [--socket PATH] [--config PATH] (got {flag!r})", file=sys.stderr)
            return 2
        opts[flag] = args.pop(0)
    path = opts.get("--socket") or default_socket(opts.get("--config"))
    try:
        sock = connect(path)
    except ConnectionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return AGENT_UNREACHABLE
    pipe(sock, sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
