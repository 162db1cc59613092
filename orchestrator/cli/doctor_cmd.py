"""`doctor`: what a box will fail on, before anything runs there."""

from __future__ import annotations

import json
import sys

import click

from orchestrator.cli.options import config_option, json_option, local_option, on_option
from orchestrator.cli.target import backend
from orchestrator.contract.ops import DOCTOR


@click.command()
@click.argument("models", nargs=-1, metavar="[MODEL...]")
@config_option
@on_option("the host of deploy.toml to check (default: the models' host, else the only one)")
@local_option
@json_option
def doctor(models: tuple[str, ...], config: str | None, host: str | None, local: bool, as_json: bool) -> None:
    """Check a box before the first switch: systemd, GPUs, each engine run as its user, weights, ports.

    One line per check, ok / warn / fail with its fix; every model of the box when none is named. Exits 1
    when a check fails.
    """
    from orchestrator.core.doctor import lines

    result = backend(config, local=local).call(DOCTOR, {"host": host, "models": list(models)})
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo("\n".join(lines(result)))
    if not result.get("ok"):
        sys.exit(1)
