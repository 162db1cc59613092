"""Every `orchestrator ...` command shown in a code block of the README or the docs names commands and
options the CLI has (parsed by its click tree; argument values are not checked, and lines written as
templates, with `|`, `[...]`, `<...>` or `...`, are left out)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from orchestrator.cli import main

REPO = Path(__file__).resolve().parents[2]
PAGES = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each `orchestrator ...` command of an indented or fenced code block."""
    found: list[tuple[str, str]] = []
    for page in PAGES:
        fenced = False
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                fenced = not fenced
                continue
            code = line[4:] if line.startswith("    ") else line if fenced else None
            if code is None:
                continue
            code = code.strip().removeprefix("$ ")
            for part in re.split(r"&&|;", code):
                part = part.split("  #")[0].split(" # ")[0].strip()
                if part.startswith("orchestrator ") and not re.search(r"[|\[\]<>]|\.\.\.", part):
                    found.append((str(page.relative_to(REPO)), part))
    return found


def test_the_docs_show_commands() -> None:
    """The search finds them (a change of format would otherwise pass by testing nothing)."""
    assert len(shown_commands()) > 40


def check(command: str) -> None:
    """Parse ``command`` down its click tree; a command or option it does not have raises UsageError."""
    args = shlex.split(command)[1:]
    cmd: click.Command = main
    ctx: click.Context | None = None
    name = "orchestrator"
    while True:
        try:
            ctx = cmd.make_context(name, args, parent=ctx)
        except (click.NoSuchOption, click.BadOptionUsage):
            raise
        except (click.BadParameter, click.exceptions.Exit):  # a value the docs write as a placeholder; --help
            return
        except click.UsageError as exc:
            if "unexpected extra argument" in exc.format_message():
                raise
            return  # a missing argument
        if not isinstance(cmd, click.Group):
            return
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        sub = cmd.get_command(ctx, rest[0])
        if sub is None:
            raise click.UsageError(f"no command {rest[0]!r} under {ctx.command_path!r}")
        cmd, name, args = sub, rest[0], rest[1:]


@pytest.mark.parametrize(("page", "command"), shown_commands())
def test_a_shown_command_parses(page: str, command: str) -> None:
    check(command)


@pytest.mark.parametrize(
    "command",
    ["orchestrator switch a --bogus", "orchestrator swtch a", "orchestrator config psh f", "orchestrator status extra"],
)
def test_a_wrong_command_is_caught(command: str) -> None:
    with pytest.raises(click.UsageError):
        check(command)
