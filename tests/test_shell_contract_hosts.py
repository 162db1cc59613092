"""The Shell port's contract on a real host, for both transports, and the SSH failure modes.

``adapters`` runs the shared cases twice: LocalShell inside the host, SshShell from here. The SSH
errors are provoked for real: a closed port, a key the host does not accept, a known_hosts entry
with another key, and sshd's session process killed while a command runs.
"""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from orchestrator.adapters import connect
from orchestrator.adapters.ssh import SshShell
from orchestrator.errors import CommandFailed, OrchestratorError, TransportError
from tests.hosts import Host, keys
from tests.hosts.fixtures import WITH_FAKES, Adapters
from tests.hosts.wait import wait_for

pytestmark = pytest.mark.hosts


def test_run_returns_exit_code_and_output(adapters: Adapters) -> None:
    """run gives the command's stdout, stderr and exit code."""
    res = adapters.shell.run(["sh", "-c", "echo out; echo err >&2; exit 0"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "out\n", "err\n")


def test_run_passes_arguments_verbatim(adapters: Adapters) -> None:
    """Arguments reach the program unchanged: spaces, quotes and $ are not interpreted."""
    arg = "a b 'c' \"d\" $HOME `id` ; rm -rf /nonexistent"
    assert adapters.shell.run(["printf", "%s", arg]).stdout == arg


def test_non_zero_exit_raises_command_failed_naming_the_command(adapters: Adapters) -> None:
    """check=True turns a non-zero exit into CommandFailed with the command, code and output."""
    with pytest.raises(CommandFailed) as err:
        adapters.shell.run(["sh", "-c", "echo why-it-failed; exit 7"])
    assert (err.value.returncode, err.value.host) == (7, adapters.host.name)
    assert "exit 7" in str(err.value) and "why-it-failed" in str(err.value)


def test_non_zero_exit_with_check_false_returns_the_result(adapters: Adapters) -> None:
    """check=False returns the failed result instead of raising."""
    assert adapters.shell.run(["sh", "-c", "exit 5"], check=False).exit_code == 5


def test_timeout_raises_command_failed_124(adapters: Adapters) -> None:
    """A command running past its timeout fails with exit code 124, like timeout(1)."""
    with pytest.raises(CommandFailed) as err:
        adapters.shell.run(["sleep", "30"], timeout=1)
    assert err.value.returncode == 124


def test_every_timeout_is_124_never_a_dropped_connection(adapters: Adapters) -> None:
    """Fifteen timeouts in a row are each exit 124: the timer closing the channel is not mistaken for a drop."""
    codes = []
    for _ in range(15):
        with pytest.raises(CommandFailed) as err:
            adapters.shell.run(["sleep", "30"], timeout=0.2)
        codes.append(err.value.returncode)
    assert codes == [124] * 15


@WITH_FAKES
def test_read_file_of_missing_path_is_none(adapters: Adapters) -> None:
    """read_file returns None for a path that does not exist."""
    assert adapters.shell.read_file(f"/etc/missing-{uuid.uuid4().hex}") is None


def test_write_then_read_round_trips_bytes_and_mode(adapters: Adapters) -> None:
    """write_file stores exactly the bytes given, with the mode given."""
    path, data = f"/etc/t-{uuid.uuid4().hex[:8]}.bin", bytes(range(256)) * 4
    adapters.shell.write_file(path, data, 0o600)
    assert adapters.shell.read_file(path) == data
    assert adapters.host.run(["stat", "-c", "%a", path]).stdout.strip() == "600"


def test_write_file_replaces_atomically(adapters: Adapters) -> None:
    """Overwriting renames a new file into place (new inode) and leaves no temp file behind."""
    directory = f"/etc/t-{uuid.uuid4().hex[:8]}"
    adapters.host.run(["mkdir", directory])
    path = f"{directory}/unit.service"
    adapters.shell.write_file(path, b"old\n")
    before = adapters.host.run(["stat", "-c", "%i", path]).stdout
    adapters.shell.write_file(path, b"new\n")
    assert adapters.host.run(["stat", "-c", "%i", path]).stdout != before
    assert adapters.host.run(["ls", "-A", directory]).stdout.split() == ["unit.service"]
    assert adapters.shell.read_file(path) == b"new\n"


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_read_file_of_a_special_file_is_refused_at_once(adapters: Adapters, kind: str) -> None:
    """read_file of a FIFO nobody writes or of /dev/zero is an error naming the path, never a hang."""
    path = f"/etc/t-{uuid.uuid4().hex[:8]}.fifo" if kind == "fifo" else "/dev/zero"
    if kind == "fifo":
        adapters.host.run(["mkfifo", path])
    with pytest.raises(OrchestratorError, match=f"cannot read {path}.*not a regular file"):
        adapters.shell.read_file(path)


def test_write_file_never_follows_a_symlink_planted_in_the_directory(adapters: Adapters) -> None:
    """Symlinks at guessable temporary names (and at the target) are replaced, their targets untouched."""
    directory = f"/etc/t-{uuid.uuid4().hex[:8]}"
    adapters.host.run(["mkdir", directory])
    adapters.host.run(["sh", "-c", f"echo precious > {directory}/victim"])
    for name in ("unit.service", "unit.service.tmp", ".unit.service.tmp", "unit.tmp", "unit.service.new"):
        adapters.host.run(["ln", "-s", f"{directory}/victim", f"{directory}/{name}"])
    adapters.shell.write_file(f"{directory}/unit.service", b"new\n")
    assert adapters.host.run(["cat", f"{directory}/victim"]).stdout == "precious\n"
    assert adapters.host.run(["stat", "-c", "%F", f"{directory}/unit.service"]).stdout.strip() == "regular file"


# -- SSH only ---------------------------------------------------------------------------------------


def ssh_shell(host: Host, **overrides: object) -> SshShell:
    args: dict[str, object] = {
        "port": host.port,
        "user": host.user,
        "key_filename": str(host.key_path),
        "known_hosts": str(host.known_hosts_path),
        "host": host.name,
    }
    args.update(overrides)
    return SshShell(host.address, **args)  # type: ignore[arg-type]


def test_ssh_reuses_one_connection(host: Host) -> None:
    """Every command of one SshShell goes over the same TCP connection."""
    shell = ssh_shell(host)
    try:
        first = shell.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout
        shell.write_file("/etc/t-reuse", b"x")
        assert shell.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout == first
    finally:
        shell.close()


def test_connect_factory_checks_the_connection_at_once(host: Host) -> None:
    """connect('ssh', ...) opens the connection itself, so a bad address fails there."""
    with pytest.raises(TransportError, match="refused"):
        connect(
            "ssh",
            host.address,
            port=1,
            key_filename=str(host.key_path),
            known_hosts=str(host.known_hosts_path),
            host=host.name,
        )


def test_ssh_refused_names_host_and_address(host: Host) -> None:
    """A port where nothing listens gives TransportError naming the host and the address."""
    with pytest.raises(TransportError) as err:
        ssh_shell(host, port=1).run(["true"])
    assert str(err.value).startswith(f"host {host.name}:")
    assert f"{host.address}:1" in str(err.value) and "refused" in str(err.value)


def test_ssh_auth_failure_names_user_and_address(host: Host, tmp_path: Path) -> None:
    """A key the host does not accept gives TransportError 'authentication failed'."""
    keys.generate_ed25519(tmp_path / "stranger", "stranger")
    with pytest.raises(TransportError) as err:
        ssh_shell(host, key_filename=str(tmp_path / "stranger")).run(["true"])
    assert "authentication failed" in str(err.value) and f"root@{host.address}" in str(err.value)


def test_ssh_host_key_mismatch_is_refused(host: Host, tmp_path: Path) -> None:
    """A host whose key differs from known_hosts is not talked to: TransportError 'mismatch'."""
    other = keys.generate_ed25519(tmp_path / "impostor", "impostor")
    keys.write_known_hosts(tmp_path / "known_hosts", [keys.known_hosts_line(host.address, host.port, other)])
    with pytest.raises(TransportError) as err:
        ssh_shell(host, known_hosts=str(tmp_path / "known_hosts")).run(["true"])
    assert "host key mismatch" in str(err.value) and host.address in str(err.value)


def test_ssh_unknown_host_key_is_not_accepted(host: Host, tmp_path: Path) -> None:
    """A host missing from known_hosts is refused, never added (no trust on first use)."""
    (tmp_path / "known_hosts").write_text("")
    with pytest.raises(TransportError, match="not found in known_hosts"):
        ssh_shell(host, known_hosts=str(tmp_path / "known_hosts")).run(["true"])
    assert (tmp_path / "known_hosts").read_text() == ""


def drop_connection_when(host: Host, shell: SshShell, marker: str) -> threading.Thread:
    """Kill the sshd process serving shell's connection once marker exists in the host."""
    transport = shell._conn.transport
    assert transport is not None
    port = transport.sock.getsockname()[1]

    def kill() -> None:
        wait_for(
            lambda: host.run(["test", "-e", marker], check=False).returncode,
            lambda rc: rc == 0,
            what=f"{marker} in {host.name}",
        )
        out = host.run(f"ss -Htnp state established '( sport = :22 and dport = :{port} )'").stdout
        pids = sorted(set(re.findall(r"pid=(\d+)", out)))
        assert pids, f"no sshd process found for client port {port}: {out!r}"
        host.run(["kill", "-9", *pids])

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_dropped_connection_fails_a_non_idempotent_command(host: Host) -> None:
    """A connection lost mid-command raises TransportError and does not run the command again."""
    shell, marker = ssh_shell(host), f"/run/t-drop-{uuid.uuid4().hex[:8]}"
    try:
        shell.connect()
        killer = drop_connection_when(host, shell, marker)
        with pytest.raises(TransportError) as err:
            shell.run(["sh", "-c", f"echo run >> {marker}; sleep 60"])
        killer.join(30)
        assert "dropped" in str(err.value) and host.address in str(err.value)
        assert host.run(["cat", marker]).stdout == "run\n"
    finally:
        shell.close()


def test_dropped_connection_retries_an_idempotent_command(host: Host) -> None:
    """An idempotent command is run again on a new connection after a drop, and succeeds."""
    shell, marker = ssh_shell(host), f"/run/t-drop-{uuid.uuid4().hex[:8]}"
    try:
        shell.connect()
        killer = drop_connection_when(host, shell, marker)
        script = f"if [ -e {marker} ]; then echo second-try; else touch {marker}; sleep 60; fi"
        res = shell.run(["sh", "-c", script], idempotent=True)
        killer.join(30)
        assert res.stdout == "second-try\n"
    finally:
        shell.close()


def test_shell_reconnects_after_a_drop(host: Host) -> None:
    """After a dropped connection the same SshShell works again on the next call."""
    shell, marker = ssh_shell(host), f"/run/t-drop-{uuid.uuid4().hex[:8]}"
    try:
        shell.connect()
        killer = drop_connection_when(host, shell, marker)
        with pytest.raises(TransportError):
            shell.run(["sh", "-c", f"touch {marker}; sleep 60"])
        killer.join(30)
        assert shell.run(["hostname"]).stdout.strip() == host.machine
    finally:
        shell.close()


def _streaming_case(shell: Any) -> None:
    lines: list[str] = []
    result = shell.run_streaming(
        ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.1; done; echo oops >&2; exit 3"], lines.append
    )
    assert lines == ["line1", "line2", "line3"]
    assert result.exit_code == 3 and "oops" in result.stderr


def test_local_run_streaming_hands_over_lines_as_they_come() -> None:
    """LocalShell.run_streaming calls back once per stdout line, keeps stderr apart, reports the exit code."""
    from orchestrator.adapters.local_shell import LocalShell

    _streaming_case(LocalShell())


def test_ssh_run_streaming_hands_over_lines_as_they_come(host: Host) -> None:
    """The same over SSH: lines arrive through fabric's output stream, whole."""
    shell, _ = connect(
        "ssh",
        host.address,
        port=host.port,
        key_filename=str(host.key_path),
        known_hosts=str(host.known_hosts_path),
        host=host.name,
    )
    try:
        _streaming_case(shell)
    finally:
        shell.close()
