"""Command-line front: parses, talks to the agent (or runs in-process), prints. No logic here.

Commands are listed in ``COMMANDS`` and their modules imported only when one runs (or a test asks
for it), so ``--help`` and a query start without the deploy stack. Errors from the project's
hierarchy are printed as one line (plus context) on stderr with their exit code, never a traceback.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import click

from orchestrator.errors import OrchestratorError

# name -> (module, attribute, the summary `--help` lists: the command's own first sentence, which
# tests/unit/test_cli_registry.py holds it to).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "adopt": (
        "adopt_cmd",
        "adopt",
        "Find engines the box runs by hand and write their deploy.toml entries (--apply: take them over).",
    ),
    "agent": (
        "agent_cmds",
        "agent",
        "Run the daemon: control socket, crash recovery, schedules, health watch, metrics.",
    ),
    "bench": (
        "bench_cmds",
        "bench",
        "Measure output tok/s, TTFT and ITL of the active deployment at rising concurrency.",
    ),
    "compare": (
        "bench_cmds",
        "compare",
        "Every model benchmarked on a host, side by side per concurrency level (latest run of each).",
    ),
    "config": (
        "config_cmds",
        "config",
        "The agent's deploy.toml: show it, diff a file against it, push a file to replace it.",
    ),
    "dashboard": (
        "dashboard_cmd",
        "dashboard",
        (
            "Open the agent's dashboard (GPUs, models, the running switch, history, charts): its Unix "
            "socket forwarded to 127.0.0.1 here, over the SSH connection with --host."
        ),
    ),
    "doctor": (
        "doctor_cmd",
        "doctor",
        "Check a box before the first switch: systemd, GPUs, each engine run as its user, weights, ports.",
    ),
    "history": (
        "deploy_cmds",
        "history",
        "Revisions, newest first: model, unit hash, trigger, outcome and the time of every phase.",
    ),
    "models": ("catalog_cmds", "models", "List the models of the catalog (with --host: of the box's deploy.toml)."),
    "plan": (
        "plan_cmd",
        "plan",
        "Say whether MODEL can load with its layout (or --tp/--ep...), why not, and what can.",
    ),
    "recover": (
        "deploy_cmds",
        "recover",
        "Finish deployments a crash or a stop left unfinished (the agent does this on start).",
    ),
    "render": ("catalog_cmds", "render", "Render each model's unit into units/ (all models when MODEL is omitted)."),
    "rollback": ("deploy_cmds", "rollback", "Go back to the last model that was healthy, or to revision --to N."),
    "rollout": (
        "rollout_cmds",
        "rollout",
        "Switch a group model on every box of its group: canary first, then in batches (see `rollout start`).",
    ),
    "schedules": ("agent_cmds", "schedules", "Scheduled operations, their next run and what they last did."),
    "stage": ("agent_cmds", "stage", "Download and verify MODEL's weights now (the serving model keeps serving)."),
    "status": ("deploy_cmds", "status", "What serves on each host, what is running, and the schedules."),
    "stop": (
        "deploy_cmds",
        "stop",
        "Stop MODEL and free its GPUs (with the proxy: its route goes first, the others keep serving).",
    ),
    "switch": (
        "deploy_cmds",
        "switch",
        "Switch the host of MODEL to MODEL: stage, stop, free GPUs, install, start, health-check.",
    ),
    "tune": (
        "tune_cmd",
        "tune",
        "Deploy each candidate layout of MODEL (a safe switch each), benchmark it, keep the winner.",
    ),
}


def load_command(name: str) -> click.Command:
    """The command ``name`` of ``COMMANDS``, its module imported now."""
    module, attr, _ = COMMANDS[name]
    command = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    assert isinstance(command, click.Command), f"{module}.{attr} is not a click command"
    return command


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return load_command(cmd_name) if cmd_name in COMMANDS else None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The summaries from the registry: listing them imports no command module.
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, _short(summary, limit)) for name, (_, _, summary) in sorted(COMMANDS.items())]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Whether the command was asked for --json: its consumer then gets a JSON document on stdout
        # whatever happens (args after "--" are operands, not options).
        ctx.meta["json"] = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OrchestratorError as exc:
            from orchestrator.secrets import redact_values

            # A message quotes bad values; a value shaped like a token is never printed.
            message = redact_values(str(exc)) + _privilege_hint(ctx, exc)
            if ctx.meta.get("json"):
                _json_error(message, exc.exit_code, type(exc).__name__, exc.partial)
            click.echo(f"error: {message}", err=True)
            sys.exit(exc.exit_code)
        except PermissionError as exc:  # a file this user may not use, met outside the errors that name it
            if exc.filename is None:
                raise
            message = f"{exc.filename}: {exc.strerror} (uid {os.geteuid()})"
            if ctx.meta.get("json"):
                _json_error(message, 2, "PermissionError", None)
            click.echo(f"error: {message}", err=True)
            sys.exit(2)
        except click.ClickException as exc:  # a bad option or argument: click prints it and exits 2
            if ctx.meta.get("json"):
                _json_error(exc.format_message(), exc.exit_code, "UsageError", None)
            raise


def _privilege_hint(ctx: click.Context, exc: OrchestratorError) -> str:
    """Why a non-root user's command could not use the state store, and the two ways it can."""
    from orchestrator.errors import StateStoreError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, PermissionError):
        cause = cause.__cause__
    if cause is None or not isinstance(exc, StateStoreError) or os.geteuid() == 0:
        return ""
    if ctx.invoked_subcommand == "agent":
        return (
            f"; `orchestrator agent` runs as root (uid {os.geteuid()} here): it owns state_dir, the units and systemd"
        )
    return (
        f"; `orchestrator {ctx.invoked_subcommand}` found no agent to ask, so it uses the state directory "
        f"itself, which only root may (uid {os.geteuid()} here): run it as root, or through the agent "
        "(its socket_group's members may ask it; `orchestrator agent` runs as root)"
    )


def _json_error(message: str, code: int, kind: str, partial: Any) -> None:
    """The one JSON document a --json command prints on stdout when it fails (the text stays on stderr)."""
    import json

    error: dict[str, Any] = {"message": message, "exit_code": code, "type": kind}
    click.echo(json.dumps({"error": error} | ({"results": partial} if partial is not None else {}), indent=2))


def _short(summary: str, limit: int) -> str:
    """``summary`` cut at a word to ``limit`` characters, as click cuts a command's own help."""
    return click.Command("_", help=summary).get_short_help_str(limit)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="orchestrator")
@click.option(
    "--host",
    "remote",
    envvar="ORCHESTRATOR_HOST",
    default=None,
    metavar="ssh://USER@BOX[:PORT]|NAME",
    help="act through the agent on that box over SSH ($ORCHESTRATOR_HOST; NAME from "
    "~/.config/orchestrator/hosts.toml or $ORCHESTRATOR_HOSTS_FILE)",
)
def main(remote: str | None) -> None:
    """Deploy inference engines' models as systemd services and switch between them safely."""
    from orchestrator import logs

    # Progress and the final error are printed by the commands; logs only when asked for.
    level = os.environ.get("ORCHESTRATOR_LOG_LEVEL", "CRITICAL").upper()
    logs.configure(json=False, level=logging.getLevelNamesMapping().get(level, logging.CRITICAL))
