"""`config show | diff FILE | push FILE`: the deploy.toml the agent runs with (on this box or --host's)."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path

import click

from orchestrator import userfiles
from orchestrator.cli.options import config_option, json_option
from orchestrator.cli.target import backend
from orchestrator.client.backends import AgentClient
from orchestrator.contract.ops import CONFIG_PUSH, CONFIG_SHOW
from orchestrator.contract.wire import MAX_REQUEST, request
from orchestrator.core.documents import text_of
from orchestrator.errors import AgentError, ConfigError


def _agent(config: str | None) -> AgentClient:
    be = backend(config)
    if not isinstance(be, AgentClient):
        raise AgentError(
            "no agent answers here: config show/diff/push act on a running agent's file "
            "(start it, or use --host ssh://BOX)"
        )
    return be


def _read(file: str) -> str:
    try:
        raw = userfiles.read_bytes(file)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=file) from None
    return text_of(raw, file)


@click.group()
def config() -> None:
    """The agent's deploy.toml: show it, diff a file against it, push a file to replace it."""


@config.command()
@config_option
@json_option
def show(config: str | None, as_json: bool) -> None:
    """Print the deploy.toml the agent runs with (and its config revision)."""
    shown = _agent(config).call(CONFIG_SHOW, {})
    if as_json:
        click.echo(json.dumps(shown, indent=2))
    else:
        click.echo(f"# {shown['path']} (config revision {shown['revision']}, sha256 {shown['sha256'][:12]})", err=True)
        click.echo(shown["text"], nl=False)


@config.command()
@click.argument("file")
@config_option
def diff(file: str, config: str | None) -> None:
    """Unified diff from the agent's deploy.toml to FILE; exit 1 when they differ."""
    text = _read(file)
    shown = _agent(config).call(CONFIG_SHOW, {})
    lines = list(
        difflib.unified_diff(
            shown["text"].splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"{shown['path']} (revision {shown['revision']})",
            tofile=file,
        )
    )
    sys.stdout.writelines(lines)
    if lines:
        sys.exit(1)


@config.command()
@click.argument("file")
@config_option
@json_option
def push(file: str, config: str | None, as_json: bool) -> None:
    """Replace the agent's deploy.toml with FILE: validated first (exit 2, nothing changed, on any error)."""
    text, name = _read(file), Path(file).name
    size = len(request(CONFIG_PUSH.name, {"text": text, "name": name}))
    if size > MAX_REQUEST:  # refused here, naming the file, rather than by the agent as "bad request"
        raise ConfigError(
            f"{len(text.encode()):,} bytes: too large to push (one request to the agent is at most "
            f"{MAX_REQUEST // 1024} KiB, this one would be {size:,} bytes)",
            file=file,
        )
    result = _agent(config).call(CONFIG_PUSH, {"text": text, "name": name})
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result["changed"]:
        click.echo(
            f"{result['path']}: config revision {result['revision']} (was {result['previous_revision']}); "
            "the agent reloaded it"
        )
    else:
        click.echo(f"{result['path']}: unchanged (config revision {result['revision']})")
    if not as_json:  # a push that changed what a proxy holds for re-rendered it (agent/demand_service.py)
        for host, what in (result.get("proxy") or {}).items():
            click.echo(f"front proxy on {host}: {what}", err=what.startswith(("not reloaded", "not stopped")))
