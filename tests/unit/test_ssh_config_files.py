"""SshShell takes explicit settings only: fabric's and OpenSSH's user and system config files (a
`gateway` there runs as a ProxyCommand, a ~/.fabric.py is imported) are never read."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from orchestrator.adapters.ssh import SshShell
from orchestrator.errors import TransportError


def closed_port() -> int:
    with socket.socket() as probe:  # bound and released: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (".fabric.yaml", 'gateway: "touch {marker}"\n'),
        (".fabric.py", 'open("{marker}", "w").close()\n'),
        (".ssh/config", "Host *\n    ProxyCommand touch {marker}\n"),
    ],
)
def test_user_config_files_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, text: str) -> None:
    """A config file in the user's home that would run a command: connecting runs nothing of it."""
    marker = tmp_path / "ran"
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text.format(marker=marker))
    (tmp_path / "known_hosts").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    shell = SshShell("127.0.0.1", port=closed_port(), known_hosts=str(tmp_path / "known_hosts"), host="box")
    try:
        with pytest.raises(TransportError, match="refused"):
            shell.connect()
    finally:
        shell.close()
    assert not marker.exists(), f"{name} was read: its command ran"
