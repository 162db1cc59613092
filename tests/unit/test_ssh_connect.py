"""SSH connects in one place (adapters/ssh_session.py): the shell a deployment uses and the session a relay or
the box lock uses map the same failure to the same TransportError."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from orchestrator.adapters.ssh import SshShell
from orchestrator.adapters.ssh_session import SshSession
from orchestrator.client.targets import Target
from orchestrator.errors import TransportError


def _closed_port() -> tuple[socket.socket, int]:
    probe = socket.socket()  # bound, never listening: a loopback port that refuses
    probe.bind(("127.0.0.1", 0))
    return probe, int(probe.getsockname()[1])


def test_a_refused_port_reads_the_same_from_the_shell_and_the_session(tmp_path: Path) -> None:
    """Nothing listens: both say "host NAME: SSH connection to ADDRESS:PORT refused", word for word."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    probe, port = _closed_port()
    with probe:
        with pytest.raises(TransportError) as shell_err:
            SshShell("127.0.0.1", port=port, host="box", known_hosts=str(known)).connect()
        with pytest.raises(TransportError) as session_err:
            SshSession(Target(name="box", address="127.0.0.1", port=port, known_hosts=str(known)))
    assert str(shell_err.value) == str(session_err.value) == f"host box: SSH connection to 127.0.0.1:{port} refused"


def test_an_unreadable_key_file_is_named_before_any_connection(tmp_path: Path) -> None:
    """A key path that is a directory: the same "cannot read SSH key PATH" from both, naming the host."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    key = tmp_path / "keydir"
    key.mkdir()
    with pytest.raises(TransportError) as shell_err:
        SshShell("127.0.0.1", port=1, host="box", key_filename=str(key), known_hosts=str(known))
    with pytest.raises(TransportError) as session_err:
        SshSession(Target(name="box", address="127.0.0.1", port=1, key=str(key), known_hosts=str(known)))
    assert str(shell_err.value) == str(session_err.value)
    assert str(shell_err.value).startswith(f"host box: cannot read SSH key {key}")


@pytest.mark.parametrize(
    ("code", "words"),
    [(errno.EHOSTUNREACH, "failed: No route to host"), (errno.ENETUNREACH, "failed: Network is unreachable")],
)
def test_an_unreachable_address_reads_unreachable_not_refused(code: int, words: str) -> None:
    """No route to the address: the error says what the system said, not "refused" (which means something answered)."""
    from paramiko.ssh_exception import NoValidConnectionsError

    from orchestrator.adapters.ssh_session import connect_errors

    with pytest.raises(TransportError) as err, connect_errors("box", "root@10.0.0.5:22", None, 10.0):
        raise NoValidConnectionsError({("10.0.0.5", 22): OSError(code, os.strerror(code))})
    assert str(err.value) == f"host box: SSH connection to 10.0.0.5:22 {words}"
