"""`orchestrator dashboard`: the agent's read-only web page, forwarded to a port on 127.0.0.1."""

from __future__ import annotations

import webbrowser
from collections.abc import Callable

import click

from orchestrator.cli.options import config_option
from orchestrator.cli.target import backend
from orchestrator.contract.ops import STATUS
from orchestrator.errors import AgentError, UsageError


@click.command()
@config_option
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="the local port on 127.0.0.1 (0: any free one)",
)
@click.option("--open/--no-open", "open_browser", default=True, help="open a browser on the page")
def dashboard(config: str | None, port: int, open_browser: bool) -> None:
    """Open the agent's dashboard (GPUs, models, the running switch, history, charts): its Unix socket
    forwarded to 127.0.0.1 here, over the SSH connection with --host. Runs until Ctrl-C."""
    from orchestrator.client.forward import Forwarder, RelayStream, Stream, unix_opener
    from orchestrator.client.remote import RemoteAgentClient

    be = backend(config)
    agent = be.call(STATUS, {"host": None}).get("agent")
    if agent is None:
        raise AgentError("no agent runs here to serve a dashboard: start it (`orchestrator agent`) or use --host")
    path = agent.get("dashboard")
    if not path:
        raise AgentError(
            "the agent serves no dashboard ([dashboard] enabled = false in its deploy.toml, or its "
            "socket could not be made: see the agent's log)"
        )
    opener: Callable[[], Stream] = (
        (lambda: RelayStream(be.open_relay(path))) if isinstance(be, RemoteAgentClient) else unix_opener(path)
    )
    try:
        fwd = Forwarder(opener, port)
    except OSError as exc:
        raise UsageError(f"--port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from exc
    click.echo(fwd.url, nl=True)
    click.echo(f"dashboard of the agent's {path} (Ctrl-C to stop)", err=True)
    if open_browser:
        webbrowser.open(fwd.url)
    try:
        fwd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fwd.server_close()
