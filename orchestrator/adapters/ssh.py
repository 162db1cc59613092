"""Shell over SSH: one persistent fabric Connection per host, strict host key checking.

Every library error is mapped here, at the boundary, into TransportError / CommandFailed naming
the host and its address. A connection that drops while a command runs is retried (reconnect and
run again) only when the caller said the command is idempotent.
"""

from __future__ import annotations

import errno
import math
import os
import shlex
import stat
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from orchestrator.adapters.local_shell import MAX_READ
from orchestrator.adapters.shell_base import checked, ignore_line, timed_out
from orchestrator.adapters.ssh_session import connect_errors, prepare, tune
from orchestrator.core.commands import command_line
from orchestrator.core.observed import CommandResult
from orchestrator.core.records import host_port
from orchestrator.errors import OrchestratorError, TransportError

T = TypeVar("T")
_RETRIES = 3


class _Dropped(Exception):
    """The connection broke under a running operation (internal; becomes TransportError)."""


def _explicit_config() -> Config:
    """Explicit settings only: fabric reads /etc/fabric.* and ~/.fabric.* unless lazy (a `gateway`
    there runs as a ProxyCommand, a .py one is imported), and OpenSSH's ssh_config files unless
    given an SSHConfig of its own; none of them may steer a connection the catalog describes."""
    return Config(
        ssh_config=paramiko.SSHConfig(), lazy=True, runtime_ssh_path=None, overrides={"load_ssh_configs": False}
    )


class SshShell:
    """Commands and files on one host through a single reused SSH connection."""

    def __init__(
        self,
        address: str,
        *,
        port: int = 22,
        user: str = "root",
        key_filename: str | None = None,
        known_hosts: str | None = None,
        host: str | None = None,
        connect_timeout: float = 10.0,
        keepalive: int = 15,
        default_keys: bool = False,
    ) -> None:
        self.host = host or address
        self.address = address
        self.port = port
        self.user = user
        self.known_hosts = known_hosts
        self._keepalive = keepalive
        self._timeout = connect_timeout
        # default_keys: with no key file, an operator's CLI may use the SSH agent and ~/.ssh keys.
        own = key_filename is None and default_keys
        kwargs: dict[str, object] = {
            "look_for_keys": own,
            "allow_agent": own,
            "banner_timeout": connect_timeout,
            "auth_timeout": connect_timeout,
        }
        if key_filename:
            kwargs["key_filename"] = key_filename
        self._conn = Connection(
            address,
            user=user,
            port=port,
            connect_timeout=int(connect_timeout),
            connect_kwargs=kwargs,
            config=_explicit_config(),
        )
        # fabric installs AutoAddPolicy; an unknown or changed host key must stop us instead.
        prepare(self._conn.client, self.host, known_hosts, key_filename)

    @property
    def where(self) -> str:
        return f"{self.user}@{host_port(self.address, self.port)}"

    # -- connection ---------------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now (it opens lazily otherwise); raises TransportError."""
        if self._conn.is_connected:
            return
        with connect_errors(self.host, self.where, self.known_hosts, self._timeout):
            self._conn.open()
        if self._conn.transport is not None:
            tune(self._conn.transport, self._keepalive)

    def server_key(self) -> str:
        """The host key this connection checked against known_hosts, as "type base64" (connects first)."""
        self.connect()
        transport = self._conn.transport
        assert transport is not None
        key = transport.get_remote_server_key()
        return f"{key.get_name()} {key.get_base64()}"

    def _reset(self) -> None:
        self._conn.close()

    def _call(self, what: str, op: Callable[[], T], idempotent: bool) -> T:
        """Run op on an open connection; a drop is retried only for idempotent operations."""

        def attempt() -> T:
            self.connect()
            try:
                return op()
            except _Dropped:
                self._reset()
                raise
            except (paramiko.SSHException, EOFError, ConnectionError) as exc:
                self._reset()
                raise _Dropped(str(exc)) from exc
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR):
                    raise
                self._reset()
                raise _Dropped(str(exc)) from exc

        try:
            if not idempotent:
                return attempt()
            return retry(
                retry=retry_if_exception_type(_Dropped),
                stop=stop_after_attempt(_RETRIES),
                wait=wait_exponential(multiplier=0.2, max=2),
                reraise=True,
            )(attempt)()
        except _Dropped as exc:
            tried = f"after {_RETRIES} attempts" if idempotent else "not retried: not idempotent"
            raise TransportError(
                f"connection to {self.address}:{self.port} dropped during {what} ({tried})", host=self.host
            ) from exc

    # -- Shell --------------------------------------------------------------------------------------

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        result = self._execute(argv, ignore_line, timeout, idempotent)
        return checked(result, self.host) if check else result

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        # Not retried: a long job (a download) restarted blindly could run twice at once.
        return self._execute(argv, on_line, timeout, idempotent=False)

    def _execute(
        self, argv: Sequence[str], on_line: Callable[[str], None], timeout: float | None, idempotent: bool
    ) -> CommandResult:
        command, shown = shlex.join(argv), command_line(argv)  # run the one, name the other

        def op() -> CommandResult:
            lines = _LineWriter(on_line)  # per attempt: a retry must not replay half a line
            limit = math.ceil(timeout) if timeout else None
            started = time.monotonic()
            try:
                res = self._conn.run(
                    command, hide="stderr", out_stream=lines, warn=True, in_stream=False, timeout=limit
                )
            except CommandTimedOut as exc:
                raise timed_out(shown, timeout, self.host) from exc
            # invoke's timer closes the channel, and invoke calls it a timeout only once that timer
            # thread has ended; on a busy machine it may not have yet, and the closed channel reads as
            # exit -1. Past the limit on our own clock, a closed channel is the timeout.
            if res.exited == -1 and limit is not None and time.monotonic() - started >= limit:
                raise timed_out(shown, timeout, self.host)
            if res.exited == -1 or not self._conn.is_connected:
                raise _Dropped(f"no exit status for {shown!r}")  # channel closed under us
            lines.finish()
            return CommandResult(command=shown, exit_code=res.exited, stdout=res.stdout, stderr=res.stderr)

        return self._call(repr(shown), op, idempotent)

    def read_file(self, path: str) -> bytes | None:
        def op() -> bytes | None:
            sftp = self._conn.sftp()
            try:
                # A FIFO would block the box's sftp-server and /dev/zero never ends: regular files only.
                st = sftp.stat(path)
                if st.st_mode is not None and not stat.S_ISREG(st.st_mode):
                    raise OrchestratorError(f"cannot read {path} on {self.address}: not a regular file", host=self.host)
                if (st.st_size or 0) > MAX_READ:
                    raise OrchestratorError(
                        f"cannot read {path} on {self.address}: {st.st_size} bytes, more "
                        f"than the {MAX_READ} read from a host",
                        host=self.host,
                    )
                with sftp.open(path, "rb") as f:
                    return bytes(f.read(MAX_READ + 1))[:MAX_READ]
            except FileNotFoundError:
                return None

        try:
            return self._call(f"read of {path}", op, idempotent=True)
        except OSError as exc:
            raise OrchestratorError(f"cannot read {path} on {self.address}: {exc}", host=self.host) from exc

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Temp file in the same directory, chmod, sync, then an atomic posix-rename."""
        tmp = f"{os.path.dirname(path) or '.'}/.{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.tmp"

        def op() -> None:
            sftp = self._conn.sftp()
            try:
                with sftp.open(tmp, "wxb") as f:  # O_CREAT|O_EXCL: never through a name planted before us
                    f.write(data)
                sftp.chmod(tmp, mode)
                # sftp has no fsync in paramiko: sync the file through the shell before renaming.
                self._conn.run(shlex.join(["sync", "--", tmp]), hide=True, warn=True, in_stream=False)
                sftp.posix_rename(tmp, path)
            except OSError:
                try:
                    sftp.remove(tmp)
                except OSError:
                    pass  # best effort: the temp name is unique and hidden
                raise

        try:
            self._call(f"write of {path}", op, idempotent=True)
        except OSError as exc:
            raise OrchestratorError(f"cannot write {path} on {self.address}: {exc}", host=self.host) from exc

    def close(self) -> None:
        self._conn.close()


class _LineWriter:
    """A file-like sink for fabric's out_stream that hands over complete lines."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self.buffer = ""

    def write(self, data: str) -> int:
        self.buffer += data
        *complete, self.buffer = self.buffer.split("\n")
        for line in complete:
            self.on_line(line)
        return len(data)

    def flush(self) -> None:
        """invoke flushes after every chunk; a partial line waits for its end."""

    def finish(self) -> None:
        if self.buffer:
            self.on_line(self.buffer)
            self.buffer = ""
