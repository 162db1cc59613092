"""How a command line is named in results and errors (pure): an inline program is named, never quoted.

A command such as ``python -c <1.5 KB of script> /run/x.sock old`` failing (a wrong interpreter path)
must say which operation failed, not carry the script into the operator's terminal and the history.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Self

# An argument to -c longer than this, or of several lines, is a program, not a word of the command.
MAX_INLINE = 120


class Script(str):
    """The text of a program run with ``-c``, named for messages: ``Script(text, "haproxy master CLI")``."""

    name: str

    def __new__(cls, text: str, name: str) -> Self:
        script = super().__new__(cls, text)
        script.name = name
        return script


def command_line(argv: Sequence[str]) -> str:
    """``argv`` as one shell-quoted line, each inline program (a Script, or a long or multi-line argument
    after -c) as ``<NAME script>`` or ``<inline script, N lines>``."""
    words = []
    for i, arg in enumerate(argv):
        after_c = i > 0 and argv[i - 1] == "-c"
        if isinstance(arg, Script):
            words.append(f"<{arg.name} script>")
        elif after_c and ("\n" in arg or len(arg) > MAX_INLINE):
            words.append(f"<inline script, {len(arg.strip().splitlines())} lines>")
        else:
            words.append(shlex.quote(arg))
    return " ".join(words)
