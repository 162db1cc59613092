"""A failed command names an inline script by what it does, never by its text: a wrong interpreter path
under HAProxy's master CLI script said 1.5 KB of Python in the error."""

from __future__ import annotations

import pytest

from orchestrator.adapters import haproxy
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.core.commands import Script, command_line
from orchestrator.errors import CommandFailed

SCRIPT = haproxy._MASTER_CLI


def test_a_missing_interpreter_names_the_script_not_its_text() -> None:
    """`/nonexistent/python -c <master CLI script>`: the error names the operation, in one short line."""
    with pytest.raises(CommandFailed) as info:
        LocalShell().run(
            ["/nonexistent/python3", "-c", SCRIPT, "master", "/run/orchestrator-proxy/master.sock", "old"], check=False
        )
    message = str(info.value)
    assert "<HAProxy master CLI (show proc) script>" in message and "import json" not in message
    assert len(message.splitlines()[0]) < 200


def test_an_exit_code_names_the_script_not_its_text() -> None:
    """A script that fails is named in the CommandFailed of a checked run."""
    with pytest.raises(CommandFailed) as info:
        LocalShell().run(["sh", "-c", Script("echo no >&2; exit 3", "probe"), "probe"])
    assert str(info.value).startswith("host localhost: command 'sh -c <probe script> probe' exited 3")


def test_an_unnamed_multi_line_script_is_counted_not_quoted() -> None:
    """A -c argument of several lines (or a long one) without a name reads as an inline script of N lines."""
    assert (
        command_line(["python3", "-c", "import os\nprint(os.getpid())\n", "x y"])
        == "python3 -c <inline script, 2 lines> 'x y'"
    )


def test_short_commands_are_quoted_as_before() -> None:
    """A plain command line is shell-quoted word by word."""
    assert command_line(["systemctl", "stop", "vllm-a b.service"]) == "systemctl stop 'vllm-a b.service'"


def test_a_long_command_from_elsewhere_is_cut_in_the_message() -> None:
    """CommandFailed cuts a command line past 400 characters and says its length."""
    message = str(CommandFailed("x" * 2000, 1, ""))
    assert "(2,000 characters)" in message and len(message) < 300
