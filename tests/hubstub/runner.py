"""A minimal local Shell with line streaming, for the weight-store tests (records every PID and
every byte of output, so tests can kill a worker and search its output)."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from orchestrator.core.observed import CommandResult
from orchestrator.errors import CommandFailed


class LocalRunner:
    host = "local"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = {**os.environ, **(env or {})}
        self.procs: list[subprocess.Popen[str]] = []
        self.output: list[str] = []
        self.started = threading.Event()

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=timeout, check=False)
        self.output += [proc.stdout, proc.stderr]
        result = CommandResult(shlex.join(argv), proc.returncode, proc.stdout, proc.stderr)
        if check and not result.ok:
            raise CommandFailed(result.command, result.exit_code, proc.stdout + proc.stderr)
        return result

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        self.procs.append(proc)
        self.started.set()
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else ""))
        reader.start()
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            on_line(line.rstrip("\n"))
        proc.wait(timeout)
        reader.join()
        self.output += lines + err
        return CommandResult(shlex.join(argv), proc.returncode, "".join(lines), "".join(err))

    def read_file(self, path: str) -> bytes | None:
        p = Path(path)
        return p.read_bytes() if p.exists() else None

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        Path(path).write_bytes(data)
        os.chmod(path, mode)

    def close(self) -> None:
        pass


class SshRunner(LocalRunner):
    """The same runner, but every command runs through ``ssh`` on another host (argv quoted once)."""

    def __init__(self, ssh: list[str]) -> None:
        super().__init__()
        self.host = ssh[-1]
        self.ssh = ssh

    def run(
        self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, idempotent: bool = False
    ) -> CommandResult:
        return super().run([*self.ssh, shlex.join(argv)], timeout=timeout, check=check)

    def run_streaming(
        self, argv: Sequence[str], on_line: Callable[[str], None], *, timeout: float | None = None
    ) -> CommandResult:
        return super().run_streaming([*self.ssh, shlex.join(argv)], on_line, timeout=timeout)
