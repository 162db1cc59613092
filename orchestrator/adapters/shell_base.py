"""What the two shells (local subprocess, SSH) share: the timeout exit code and the exit check.

Each shell has one run algorithm, ``_execute`` (stream stdout lines to a callback, collect the
result); ``run`` is that plus the exit check, so a local and a remote command fail alike.
"""

from __future__ import annotations

from orchestrator.core.observed import CommandResult
from orchestrator.errors import CommandFailed

TIMEOUT_EXIT = 124  # what coreutils timeout(1) exits with


def timed_out(command: str, timeout: float | None, host: str) -> CommandFailed:
    return CommandFailed(command, TIMEOUT_EXIT, f"timed out after {timeout or 0:g} s", host=host)


def checked(result: CommandResult, host: str) -> CommandResult:
    """The result, or CommandFailed naming the command, its exit code and its output."""
    if not result.ok:
        raise CommandFailed(result.command, result.exit_code, result.stdout + result.stderr, host=host)
    return result


def ignore_line(line: str) -> None:
    """on_line for ``run``: the output is collected, not streamed."""
