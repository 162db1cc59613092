"""`agent`, `schedules` and `stage`."""

from __future__ import annotations

import sys

import click

from orchestrator import logs, settings
from orchestrator.cli.agent_install import install
from orchestrator.cli.options import (
    config_option,
    int_in,
    json_option,
    local_option,
    nonempty,
    printed,
)
from orchestrator.cli.tables import print_table, stdout_console
from orchestrator.cli.target import backend, run_model_job
from orchestrator.contract.ops import SCHEDULES, STAGE

ENDED = "none (its last fire time has passed)"


@click.group(invoke_without_command=True)
@config_option
@click.option(
    "--socket",
    "socket_path",
    default=None,
    metavar="PATH",
    callback=nonempty,
    help="control socket (default: <state_dir>/agent.sock or $ORCHESTRATOR_SOCKET)",
)
@click.option(
    "--metrics-port",
    type=int_in(0, 65535),
    default=None,
    help="Prometheus endpoint on 127.0.0.1 (default: metrics_port of deploy.toml, 9464; 0 disables it)",
)
@click.pass_context
def agent(ctx: click.Context, config: str | None, socket_path: str | None, metrics_port: int | None) -> None:
    """Run the daemon: control socket, crash recovery, schedules, health watch, metrics."""
    if ctx.invoked_subcommand is not None:
        return
    from orchestrator.agent.daemon import Agent
    from orchestrator.wiring import operations

    logs.configure(json=True)
    cat = settings.load(config)
    port = cat.metrics_port if metrics_port is None else metrics_port
    Agent(
        cat,
        operations(cat),
        socket=socket_path,
        metrics_port=port or None,
        config_path=str(settings.config_path(config).resolve()),
        ops_factory=operations,
    ).run()


@agent.command("dial-stdio")
@click.option(
    "--socket",
    "socket_path",
    default=None,
    metavar="PATH",
    callback=nonempty,
    help="the agent's socket (default: $ORCHESTRATOR_SOCKET, else <state_dir>/agent.sock of the box's deploy.toml)",
)
@config_option
def dial_stdio(socket_path: str | None, config: str | None) -> None:
    """Relay stdin/stdout to the agent's socket (what a remote `orchestrator --host` runs over SSH)."""
    from orchestrator.agent import relay

    argv = (["--socket", socket_path] if socket_path else []) + (["--config", config] if config else [])
    sys.exit(relay.main(argv))


agent.add_command(install)


@click.command()
@config_option
@json_option
def schedules(config: str | None, as_json: bool) -> None:
    """Scheduled operations, their next run and what they last did."""
    rows = backend(config).call(SCHEDULES, {})
    if printed(rows, as_json, empty=lambda: f"no schedules in {settings.config_path(config)}"):
        return
    print_table(
        stdout_console(),
        ["schedule", "cron", "action", "model", "window", "next run", "last"],
        [
            [
                r["name"],
                r["cron"],
                r["action"],
                r.get("model") or "",
                r.get("window") or "",
                r["next_run"] or ENDED,
                " ".join(str((r.get("last") or {}).get(k, "")) for k in ("kind", "reason")).strip(),
            ]
            for r in rows
        ],
    )


@click.command()
@click.argument("model")
@config_option
@local_option
@json_option
def stage(model: str, config: str | None, local: bool, as_json: bool) -> None:
    """Download and verify MODEL's weights now (the serving model keeps serving)."""
    run_model_job(
        STAGE,
        model,
        config,
        local,
        as_json,
        text=lambda r: (
            f"{model} staged on {r['host']}: {r['path']} (revision {r['revision']}, {r['bytes'] / 2**30:.2f} GiB)"
        ),
    )
