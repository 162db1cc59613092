"""Command-line front: parses, talks to the agent (or runs in-process), prints. No logic here.

Each command module registers its commands on ``main``; errors from the project's hierarchy are
printed as one line (plus context) on stderr with their exit code, never as a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import click

from orchestrator import logs
from orchestrator.core.secrets import redact_values
from orchestrator.errors import OrchestratorError


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OrchestratorError as exc:
            # A message quotes bad values; a value shaped like a token is never printed.
            click.echo(f"error: {redact_values(str(exc))}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="orchestrator")
@click.option("--host", "remote", envvar="ORCHESTRATOR_HOST", default=None, metavar="ssh://USER@BOX[:PORT]|NAME",
              help="act through the agent on that box over SSH ($ORCHESTRATOR_HOST; NAME from "
                   "~/.config/orchestrator/hosts.toml or $ORCHESTRATOR_HOSTS_FILE)")
def main(remote: str | None) -> None:
    """Deploy vLLM models as systemd services and switch between them safely."""
    # Progress and the final error are printed by the commands; logs only when asked for.
    level = os.environ.get("ORCHESTRATOR_LOG_LEVEL", "CRITICAL").upper()
    logs.configure(json=False, level=logging.getLevelNamesMapping().get(level, logging.CRITICAL))


from orchestrator.cli import (  # noqa: F401
    agent_cmds,
    agent_install,
    bench_cmds,
    catalog_cmds,
    config_cmds,
    dashboard_cmd,
    deploy_cmds,
    plan_cmd,
    rollout_cmds,
    tune_cmd,
)
