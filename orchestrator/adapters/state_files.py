"""Permissions of the state directory and the database in it.

The database keeps every unit's text and every error message, so neither it nor its directory
may be readable by everyone, including when an older version (or an operator) left them 0755/0644.
The directory is 0750 and group-owned by the socket group when we are root and the group exists
(members reach ``agent.sock`` in it), else 0700; the database and its WAL files are 0600.
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from orchestrator.errors import StateStoreError

# Directories the system shares: a state_dir pointing at one would be chmod-ed into uselessness.
_SHARED = frozenset(
    {
        "/",
        "/tmp",
        "/var",
        "/var/tmp",
        "/var/lib",
        "/etc",
        "/home",
        "/root",
        "/usr",
        "/opt",
        "/srv",
        "/run",
        "/dev",
        "/dev/shm",
    }
)


def _gid(group: str | None) -> int | None:
    if group is None or os.geteuid() != 0:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def secure_state_file(path: Path, group: str | None) -> None:
    """Create ``path``'s directory and ``path`` with private modes, tightening existing ones."""
    directory = path.parent.absolute()
    if str(directory) in _SHARED or (directory.is_dir() and directory.stat().st_mode & stat.S_IWOTH):
        raise StateStoreError(
            f"state store {path}: state_dir {directory} is a shared directory; give "
            f"orchestrator a directory of its own (e.g. /var/lib/orchestrator)"
        )
    gid = _gid(group)
    mode = 0o750 if gid is not None else 0o700
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=mode)
        st = directory.stat()
        if st.st_uid == os.geteuid():  # someone else's directory is theirs to fix; we only read it
            if gid is not None and st.st_gid != gid:
                os.chown(directory, -1, gid)
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(directory, mode)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if file.exists() and file.stat().st_uid == os.geteuid() and stat.S_IMODE(file.stat().st_mode) & 0o077:
                os.chmod(file, 0o600)
    except OSError as exc:
        raise StateStoreError(f"state store {path}: cannot create or secure it: {exc.strerror}") from exc
