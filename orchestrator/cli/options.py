"""Options shared by every command."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from orchestrator.core import bounds

F = TypeVar("F", bound=Callable[..., Any])

# Upper bounds of numeric options (every one has one): ids as SQLite stores them, tokens and requests
# per benchmark level, seconds, hosts of a group.
MAX_ID = bounds.MAX_ID
MAX_COUNT = 10_000_000
MAX_SECONDS = 7 * 86_400.0
MAX_HOSTS = 10_000


def nonempty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A path option given as '' (an unset shell variable in `--config "$CFG"`) is refused, never read
    as the default file or the working directory."""
    if value == "":
        raise click.BadParameter(
            "an empty path (an unset variable?): name the file or directory, or leave the option out",
            ctx=ctx,
            param=param,
        )
    return value


def config_option(f: F) -> F:
    return click.option(
        "--config",
        "config",
        metavar="PATH",
        default=None,
        callback=nonempty,
        help="deploy.toml to use (default: $ORCHESTRATOR_CONFIG or ./deploy.toml)",
    )(f)


def on_option(help: str, dest: str = "host") -> Callable[[F], F]:
    """``--on HOST``: the host of deploy.toml (``[hosts.HOST]``) a command acts on. ``--host`` before the
    command is the SSH box whose agent answers; after it, the old spelling of ``--on``, it is refused
    with the new one named (exit 2), so that ``--host`` means one thing."""

    def add(f: F) -> F:
        f = click.option("--on", dest, metavar="HOST", default=None, help=help)(f)
        return click.option(
            "--host", "moved_host", default=None, hidden=True, expose_value=False, callback=_host_moved
        )(f)

    return add


def _host_moved(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        name = ctx.info_name
        raise click.UsageError(
            f"`{name} --host {value}`: a host of deploy.toml is named with --on now "
            f"(`orchestrator {name} --on {value}`); --host goes before the command and "
            f"reaches a box's agent over SSH (`orchestrator --host BOX {name}`)",
            ctx=ctx,
        )


def local_option(f: F) -> F:
    return click.option("--local", "local", is_flag=True, help="run in this process even if an agent is running")(f)


def read_local_option(f: F) -> F:
    return click.option("--local", "local", is_flag=True, help="read the state here even if an agent is running")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")(f)


def printed(
    value: Any, as_json: bool, *, empty: Callable[[], str] | None = None, text: Callable[[Any], str] | None = None
) -> bool:
    """What a command prints of an answer, in one place: with --json the answer as JSON; else for an
    empty one the words ``empty`` says, else ``text`` of it. False: nothing printed (the caller prints
    its table)."""
    if as_json:
        click.echo(json.dumps(value, indent=2))
    elif empty is not None and not value:
        click.echo(empty())
    elif text is not None:
        click.echo(text(value))
    else:
        return False
    return True


class Bounded(click.ParamType[float, Any]):
    """An int or float option within [lo, hi], checked by core.bounds: ASCII digits, finite, the value
    quoted cut short when huge; click names the option and exits 2."""

    def __init__(self, kind: type[int | float], lo: float, hi: float) -> None:
        self.kind, self.lo, self.hi = kind, lo, hi
        self.name = "integer" if kind is int else "number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)  # a default arrives as a number, the command line as text
        try:
            if self.kind is int:
                return bounds.parse_int(text, int(self.lo), int(self.hi))
            return bounds.parse_float(text, self.lo, self.hi)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def int_in(lo: int, hi: int) -> Bounded:
    return Bounded(int, lo, hi)


def number_in(lo: float, hi: float) -> Bounded:
    return Bounded(float, lo, hi)
