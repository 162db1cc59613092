"""SSH keys for test hosts: one client key per run, one host key per host, known_hosts from them.

The harness generates every host key itself before boot, so known_hosts is written from keys we
hold, never learned from the network (no trust-on-first-use anywhere in the tests).
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def generate_ed25519(path: Path, comment: str) -> str:
    """Create an ed25519 key pair at path (+ .pub); returns the public key line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path.with_name(path.name + ".pub").read_text().strip()


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """One known_hosts line in OpenSSH's format ([addr]:port when the port is not 22)."""
    host = address if port == 22 else f"[{address}]:{port}"
    keytype, blob = public_key.split()[:2]
    return f"{host} {keytype} {blob}\n"


def write_known_hosts(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(path)
