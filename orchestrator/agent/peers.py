"""Who is on the other end of the control socket, as the box sees them (not what a client claims).

The user comes from the socket peer's uid (the kernel's word). A remote CLI reaches the socket
through the relay, which sshd started as the SSH login user with SSH_CONNECTION in its
environment; the agent (root) reads that from /proc, so the relay stays a plain byte pipe.
"""

from __future__ import annotations

import pwd


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def ssh_client_address(pid: int) -> str | None:
    """The SSH client's address from the peer process's SSH_CONNECTION, when it came over SSH."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return None  # gone already, or not ours to read: the uid alone names the operator
    for item in env:
        if item.startswith(b"SSH_CONNECTION="):
            fields = item.split(b"=", 1)[1].decode(errors="replace").split()
            return fields[0] if fields else None
    return None


def operator(pid: int, uid: int) -> str:
    """'alice@10.0.0.7' for an SSH login through the relay, 'alice@socket' for a local client: the
    audit trail's name for a caller, as the kernel told us, never what the client says."""
    origin = ssh_client_address(pid) if pid > 0 else None
    return f"{user_name(uid)}@{origin or 'socket'}"
