"""known_hosts for paramiko, read through :mod:`orchestrator.userfiles` (bounded, never blocking)."""

from __future__ import annotations

import os

import paramiko

from orchestrator import userfiles

MAX_KNOWN_HOSTS = 4 << 20


def load_known_hosts(client: paramiko.SSHClient, path: str | None) -> None:
    """Host keys from ``path`` (else ~/.ssh/known_hosts), read bounded and without blocking (a FIFO
    or /dev/zero is refused, OSError); lines paramiko cannot parse are skipped, as its own loader does."""
    if not path:
        default = os.path.expanduser("~/.ssh/known_hosts")
        if not os.path.exists(default):
            return
        path = default
    keys = client.get_host_keys()
    for lineno, line in enumerate(userfiles.read_text(path, limit=MAX_KNOWN_HOSTS).splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except paramiko.SSHException:
            continue
        if entry is not None and entry.key is not None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
