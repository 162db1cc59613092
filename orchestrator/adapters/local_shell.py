"""Shell on the machine the orchestrator runs on (subprocess; no shell in between)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Sequence

from orchestrator import userfiles
from orchestrator.adapters.shell_base import checked, ignore_line, timed_out
from orchestrator.core.commands import command_line
from orchestrator.core.observed import CommandResult
from orchestrator.errors import CommandFailed, OrchestratorError

# The largest file the product reads from a host (a shard index, a unit, a config): never a weight shard.
MAX_READ = 256 << 20


class LocalShell:
    """Runs argv directly with subprocess; files are written atomically (temp, fsync, rename)."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        # idempotent only matters for transports that can drop; a local run cannot.
        result = self._execute(argv, ignore_line, timeout)
        return checked(result, self.host) if check else result

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        return self._execute(argv, on_line, timeout)

    def _execute(self, argv: Sequence[str], on_line: Callable[[str], None], timeout: float | None) -> CommandResult:
        command = command_line(argv)  # an inline script named, not quoted
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise CommandFailed(command, 127, f"{argv[0]}: command not found", host=self.host) from exc
        # stderr is drained on its own thread so a chatty child never blocks on a full pipe.
        err: list[str] = []
        drain = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""), daemon=True)
        drain.start()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        killer = threading.Timer(timeout, expire) if timeout else None
        if killer is not None:
            killer.start()
        out: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.append(line)
                on_line(line.rstrip("\n"))
            code = proc.wait()
        finally:
            if killer is not None:
                killer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        drain.join()
        if expired.is_set():
            raise timed_out(command, timeout, self.host)
        return CommandResult(command=command, exit_code=code, stdout="".join(out), stderr="".join(err))

    def read_file(self, path: str) -> bytes | None:
        try:  # paths under a user's weights directory too: a FIFO or /dev/zero there must not hang the agent
            return userfiles.read_bytes(path, limit=MAX_READ)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise OrchestratorError(f"cannot read {path}: {exc.strerror}", host=self.host) from exc

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        try:
            userfiles.write_atomic(path, data, mode=mode)
        except OSError as exc:
            raise OrchestratorError(f"cannot write {path}: {exc.strerror}", host=self.host) from exc

    def close(self) -> None:
        return None
