"""Who is on the other end of the control socket, as the box sees them (not what a client claims).

The user comes from the socket peer's uid (SO_PEERCRED: the kernel's word). The SSH address comes
from the kernel too, never from the client's environment: the peer process descends from the sshd
session that started it, and the nearest ancestor that runs sshd as root (the session's monitor,
which the login user cannot change) holds the TCP connection; its remote end, read from that
process's own /proc/PID/net/tcp{,6} by socket inode, is the address. ``SSH_CONNECTION`` is set by
the client's own shell and can say anything: when no sshd ancestor vouches for an address, a value
there is recorded only as a claim (``alice@socket (claims ssh from 6.6.6.6)``).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket

SSHD_NAMES = frozenset({"sshd", "sshd-session"})  # OpenSSH 9.8+ runs sessions as sshd-session
_MAX_DEPTH = 64
_ESTABLISHED = "01"


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:  # procfs files: small, never blocking
            return fh.read(1 << 20).decode(errors="replace")
    except OSError:
        return None


def _parent(pid: int, proc: str) -> int:
    stat = _read(f"{proc}/{pid}/stat")
    if stat is None or ")" not in stat:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def _root_sshd(pid: int, proc: str) -> bool:
    """Whether ``pid`` runs the sshd binary with every uid 0: nothing a login user can start or alter."""
    status = _read(f"{proc}/{pid}/status") or ""
    uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), None)
    if not uids or any(u != "0" for u in uids):
        return False
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        return False
    return os.path.basename(exe.removesuffix(" (deleted)")) in SSHD_NAMES


def _socket_inodes(pid: int, proc: str) -> set[int]:
    inodes = set()
    try:
        fds = os.listdir(f"{proc}/{pid}/fd")
    except OSError:
        return set()
    for fd in fds:
        try:
            target = os.readlink(f"{proc}/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[8:-1]))
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # /proc/net/tcp6 prints the 16 bytes as four host-order (little-endian) 32-bit words.
    addr = ipaddress.IPv6Address(b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))
    return str(addr.ipv4_mapped or addr)


def _tcp_peer(pid: int, proc: str) -> str | None:
    """The remote address of an established TCP connection ``pid`` holds, in its own network namespace."""
    inodes = _socket_inodes(pid, proc)
    if not inodes:
        return None
    for table in ("tcp", "tcp6"):
        for line in (_read(f"{proc}/{pid}/net/{table}") or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _ESTABLISHED and fields[9].isdigit() and int(fields[9]) in inodes:
                return _address(fields[2].split(":")[0])
    return None


def ssh_client_address(pid: int, proc: str = "/proc") -> str | None:
    """The SSH client's address of the session ``pid`` runs in, as sshd's own connection shows it."""
    depth, in_sshd = 0, False
    while pid > 1 and depth < _MAX_DEPTH:
        if _root_sshd(pid, proc):
            in_sshd = True
            peer = _tcp_peer(pid, proc)
            if peer is not None:
                return peer
        elif in_sshd:
            return None  # past this session's sshd processes: an outer session is not this caller's
        pid, depth = _parent(pid, proc), depth + 1
    return None


def claimed_address(pid: int, proc: str = "/proc") -> str | None:
    """The address the peer's own SSH_CONNECTION claims (any process can set it), if it is an IP."""
    env = _read(f"{proc}/{pid}/environ") or ""
    for item in env.split("\0"):
        if item.startswith("SSH_CONNECTION="):
            first = (item.split("=", 1)[1].split() or [""])[0]
            try:
                return str(ipaddress.ip_address(first))
            except ValueError:
                return None
    return None


def operator(pid: int, uid: int) -> str:
    """'alice@10.0.0.7' for an SSH login (address from sshd's connection), 'alice@socket' for a local
    client: the audit trail's name for a caller, as the kernel told us, never what the client says."""
    user = user_name(uid)
    if pid <= 0:
        return f"{user}@socket"
    origin = ssh_client_address(pid)
    if origin is not None:
        return f"{user}@{origin}"
    claim = claimed_address(pid)
    return f"{user}@socket" + (f" (claims ssh from {claim})" if claim else "")
