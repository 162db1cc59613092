"""Whether an account can connect to a Unix socket, from the modes and owners along its path (pure).

Connecting needs search (x) on every directory from / down to the socket's and write (w) on the
socket itself; the kernel takes the owner's bits when the account owns the file, else the group's
when it is in the file's group, else the others'. Models on demand: HAProxy's workers, dropped to
`[proxy] user`, connect to the agent's demand socket (agent/demand_server.py reads the path)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Entry:
    """One path on the way: a directory, or the socket last."""

    path: str
    mode: int  # st_mode
    uid: int
    gid: int
    owner: str  # the names, for the message
    group: str


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gids: frozenset[int]  # its group (HAProxy's `group`) and its supplementary groups


def path_chain(path: str) -> list[str]:
    """The paths the kernel walks to reach ``path`` (absolute): /, each directory down, then ``path``
    itself; the one list every check of a socket's reachability builds its Entries from."""
    if not path.startswith("/"):
        raise ValueError(f"socket path {path!r} is not absolute")
    parts = PurePosixPath("/" + path.lstrip("/")).parts  # POSIX keeps a leading // apart; the kernel does not
    return [str(PurePosixPath(*parts[:i])) for i in range(1, len(parts) + 1)]


def _bits(entry: Entry, who: Account) -> tuple[int, str]:
    """The permission bits that apply to ``who`` on ``entry`` (rwx as 4, 2, 1) and by which class."""
    if who.uid == entry.uid:
        return (entry.mode >> 6) & 7, "owner"
    if entry.gid in who.gids:
        return (entry.mode >> 3) & 7, "group"
    return entry.mode & 7, "others"


def missing_access(chain: Sequence[Entry], who: Account) -> str | None:
    """What ``who`` lacks to connect to the socket at the end of ``chain`` (the directories from /
    down, then the socket), naming the path, its mode and owners; None when nothing is missing."""
    if who.uid == 0:
        return None
    *dirs, sock = chain
    for d in dirs:
        bits, cls = _bits(d, who)
        if not bits & 1:
            return (
                f"search (x) on directory {d.path} ({stat.filemode(d.mode)} {d.owner}:{d.group}; "
                f"{who.name} is among its {cls})"
            )
    bits, cls = _bits(sock, who)
    if not bits & 2:
        return (
            f"write (w) on socket {sock.path} ({stat.filemode(sock.mode)} {sock.owner}:{sock.group}; "
            f"{who.name} is among its {cls})"
        )
    return None
