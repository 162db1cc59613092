"""The agent's Unix socket servers: the paths they bind at, and how many connections they serve at once.

A path is cleared before the bind only when what is there is a stale socket of the agent's own, and
removed at the end only when it is still the one bound.

The agent runs as root, and a socket path comes from deploy.toml: "unlink, then bind" would let
whoever chose the path delete any file (``socket = "/etc/shadow"``). So a path that holds anything but
a socket owned by this process's user (a regular file, a directory, a symlink, another user's socket)
is refused with an error naming it, and so is a socket something still listens on; at close, a path
whose inode is no longer the one bound (replaced since) is left alone. A server serves at most ``slots``
connections at once, each on its own thread; one beyond goes to ``turn_away``. Standard library only.
"""

from __future__ import annotations

import os
import socket
import socketserver
import stat
import threading
from typing import Any, NamedTuple

from orchestrator.errors import AgentError

_KINDS = (
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class Bound(NamedTuple):
    """What a server bound: its path and the socket file's identity (device, inode)."""

    path: str
    dev: int
    ino: int


def clear_stale(path: str, what: str) -> None:
    """Make room to bind ``what`` at ``path``: nothing there, or a stale socket of this user's, removed.
    Anything else raises AgentError naming the path and what is there; nothing else is removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a socket")
        raise AgentError(
            f"{what} {path}: {kind} is there, not a socket; the agent removes only a stale "
            "socket of its own: choose another path, or move that away"
        )
    if st.st_uid != os.geteuid():
        raise AgentError(
            f"{what} {path}: a socket of uid {st.st_uid} is there, not one the agent (uid "
            f"{os.geteuid()}) made: choose another path, or remove it yourself"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # a socket of ours nothing listens on: left by an agent that crashed
        return
    finally:
        probe.close()
    raise AgentError(f"{what} {path}: something already listens there (another agent?)")


def bound(path: str) -> Bound:
    """The identity of the socket just bound at ``path`` (to remove it, and only it, at the end)."""
    st = os.lstat(path)
    return Bound(path, st.st_dev, st.st_ino)


def remove(sock: Bound | None) -> None:
    """Remove the socket file ``sock`` names if it is still the one bound; anything put there since stays."""
    if sock is None:
        return
    try:
        st = os.lstat(sock.path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (sock.dev, sock.ino):
        os.unlink(sock.path)


class BoundedServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A threading Unix socket server with at most ``slots`` connections in service at once: the one
    beyond goes to ``turn_away`` (which must close it), never to a thread of its own."""

    daemon_threads = True
    # listen()'s backlog: socketserver's 5 made the 6th connection made while the accept thread was
    # starved (a loaded box) fail at once for a non-blocking client (HAProxy's Lua: a held request's 503);
    # the kernel caps it at net.core.somaxconn
    request_queue_size = 4096
    slots: threading.BoundedSemaphore

    def turn_away(self, request: socket.socket) -> None:
        self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.turn_away(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # whatever kept a thread from taking it (re-raised): its slot is free again
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()
