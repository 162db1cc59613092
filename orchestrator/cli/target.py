"""Which backend a command gets: the box's agent over SSH (--host), the local agent, or in-process."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from orchestrator.contract.operation import Operation
from orchestrator.contract.ops import CONFIG_SHOW
from orchestrator.contract.wire import socket_path
from orchestrator.errors import UsageError

if TYPE_CHECKING:  # imported where used: a query through an agent never loads the in-process stack
    from orchestrator.client.backends import AgentClient, Backend
    from orchestrator.core.catalog import Catalog


def remote_spec() -> str | None:
    """The global --host (or $ORCHESTRATOR_HOST) of this invocation, if any."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.find_root().params.get("remote")


def remote_source() -> str:
    """Where the remote spec came from, as messages name it: the option or the variable."""
    ctx = click.get_current_context(silent=True)
    from_env = ctx is not None and ctx.find_root().get_parameter_source("remote") == ParameterSource.ENVIRONMENT
    return "ORCHESTRATOR_HOST" if from_env else "--host"


def backend(config: str | None, *, local: bool = False, ignore_agent: bool = False) -> Backend:
    """--host: the box's agent through the SSH relay (the box's deploy.toml rules); else as before."""
    spec = remote_spec()
    if spec is None:
        from orchestrator import settings
        from orchestrator.client.backends import agent_at, backend_for

        # The agent's socket from deploy.toml read as TOML only: the agent checks the request against
        # its own catalog, so a query through it validates nothing here. In-process, the catalog is
        # loaded (and a bad file refused, exit 2) as before.
        peeked = None if local else settings.peek(config)
        client = None if peeked is None else agent_at(socket_path(peeked.state_dir))
        if client is None and peeked is None and not local:
            client = _box_agent(config)
        if client is not None:
            return client
        return backend_for(settings.load(config), local=local, ignore_agent=ignore_agent)
    if local:
        raise UsageError(f"--local runs in this process; it cannot be combined with --host {spec}")
    if config is not None:
        raise UsageError(
            f"--config {config}: with --host {spec} the box's own deploy.toml is used (see `orchestrator config show`)"
        )
    from orchestrator.client.remote import RemoteAgentClient
    from orchestrator.client.targets import resolve

    client = RemoteAgentClient(resolve(spec, remote_source()))
    click.get_current_context().call_on_close(client.close)
    return client


def _box_agent(config: str | None) -> AgentClient | None:
    """The box's agent, found as the SSH relay finds it ($ORCHESTRATOR_SOCKET, else the state dir of
    /etc/orchestrator/deploy.toml, else the default one), when this user cannot read the deploy.toml
    asked for (0640 root:root: a socket-group member on the box) or asked for none and ./deploy.toml
    is not there. None otherwise: a file named that is missing, or one that reads, keeps its own error."""
    import os

    from orchestrator import settings
    from orchestrator.agent.relay import default_socket
    from orchestrator.client.backends import agent_at

    file = settings.config_path(config)
    if os.path.exists(file):
        if os.access(file, os.R_OK):
            return None
    elif config or os.environ.get("ORCHESTRATOR_CONFIG"):
        return None
    return agent_at(default_socket(config))


def run_model_job(
    op: Operation[Any, dict[str, Any]],
    model: str,
    config: str | None,
    local: bool,
    as_json: bool,
    text: Callable[[dict[str, Any]], str],
) -> None:
    """A job on MODEL's host through whichever backend (progress on stderr); its result as JSON or ``text``."""
    from orchestrator.cli.options import printed
    from orchestrator.cli.progress import with_progress

    be = backend(config, local=local)
    printed(with_progress(as_json, lambda p: be.call(op, {"model": model}, p)), as_json, text=text)


def catalog(config: str | None) -> Catalog:
    """The catalog a command reads: with --host the box's own deploy.toml (its agent's `config show`,
    validated here; a model's `config` path is the box's and is not read), else --config's."""
    from orchestrator import settings

    spec = remote_spec()
    if spec is None:
        return settings.load(config)
    shown = backend(config).call(CONFIG_SHOW, {})  # backend() refuses --config with --host
    return settings.load_text(str(shown["text"]), f"{spec}: {shown['path']}")


def local_only(command: str) -> None:
    """Commands that do not go through the agent yet refuse --host instead of acting locally."""
    spec = remote_spec()
    if spec is not None:
        raise UsageError(
            f"{command} does not go through the agent yet: run it on the box "
            f"(ssh {spec.removeprefix('ssh://')} orchestrator {command}), without --host"
        )
