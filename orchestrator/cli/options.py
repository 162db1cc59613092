"""Options shared by every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def config_option(f: F) -> F:
    return click.option("--config", "config", metavar="PATH", default=None,
                        help="deploy.toml to use (default: $ORCHESTRATOR_CONFIG or ./deploy.toml)")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")(f)
