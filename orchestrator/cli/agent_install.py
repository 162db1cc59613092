"""`agent install`: put the agent on a box over SSH (orchestrator/bootstrap)."""

from __future__ import annotations

import json

import click

from orchestrator import userfiles
from orchestrator.cli.options import json_option, nonempty
from orchestrator.cli.target import remote_spec
from orchestrator.core.documents import text_of
from orchestrator.errors import UsageError


@click.command("install")
@click.argument("target", metavar="ssh://USER@BOX[:PORT]|NAME")
@click.option(
    "--upgrade",
    is_flag=True,
    help="replace an installed package with this tree's and restart the agent (only between operations)",
)
@click.option(
    "--config",
    "config",
    metavar="FILE",
    callback=nonempty,
    default=None,
    help="deploy.toml for the box when it has none (default: a minimal one: the box itself, its GPUs)",
)
@click.option(
    "--key",
    metavar="PATH",
    callback=nonempty,
    default=None,
    help="SSH private key (default: hosts file, ssh-agent, ~/.ssh)",
)
@click.option(
    "--known-hosts",
    metavar="PATH",
    callback=nonempty,
    default=None,
    help="known_hosts to check the box's key against (default: hosts file, else ~/.ssh/known_hosts)",
)
@click.option(
    "--python",
    "base_python",
    metavar="PATH",
    callback=nonempty,
    default="/usr/bin/python3",
    show_default=True,
    help="the box's Python (>= 3.11) the venv is made from",
)
@click.option(
    "--source",
    metavar="DIR",
    callback=nonempty,
    default=None,
    help="project tree to build the wheel from (default: this one)",
)
@click.option(
    "--wheel",
    metavar="FILE",
    callback=nonempty,
    default=None,
    help="install this orchestrator wheel instead of building one",
)
@click.option(
    "--wheelhouse",
    metavar="DIR",
    callback=nonempty,
    default=None,
    help="dependency wheels for the box (default: resolved here into ~/.cache/orchestrator/wheelhouse)",
)
@click.option(
    "--authorize",
    is_flag=True,
    help="a controller (deploy.toml with groups): also add its key to each group host's authorized_keys, "
    "reaching them from here with --key/--known-hosts (default: print the key to authorize)",
)
@json_option
def install(
    target: str,
    upgrade: bool,
    config: str | None,
    key: str | None,
    known_hosts: str | None,
    base_python: str,
    source: str | None,
    wheel: str | None,
    wheelhouse: str | None,
    authorize: bool,
    as_json: bool,
) -> None:
    """Install (or --upgrade) the agent on a box over one SSH connection; a second run changes nothing.

    On a fleet's controller (its deploy.toml has groups) it also makes the SSH identity the controller
    reaches the group's agents with: each group host's ssh_key (generated on the box when missing) and
    its host key in the controller's known_hosts."""
    from orchestrator.adapters.ssh import SshShell
    from orchestrator.bootstrap.controller_keys import Reach, group_hosts
    from orchestrator.bootstrap.install import Installer, Options, validate_config
    from orchestrator.client.targets import resolve

    if remote_spec() is not None:
        raise UsageError(f"agent install takes the box as its argument; drop --host {remote_spec()}")
    if source and wheel:
        raise UsageError("--source and --wheel exclude each other: build from a tree or install a wheel")
    opts = Options(
        upgrade=upgrade,
        base_python=base_python,
        source=source,
        wheel=wheel,
        wheelhouse=wheelhouse,
        authorize=Reach(key, known_hosts) if authorize else None,
    )
    if config is not None:
        try:
            opts.config_text, opts.config_name = text_of(userfiles.read_bytes(config), config), config
        except OSError as exc:
            raise UsageError(f"--config {config}: cannot read: {exc.strerror}") from None
        group_hosts(validate_config(opts.config_text, config))  # exit 2 before anything is sent
    box = resolve(target, "agent install TARGET")
    shell = SshShell(
        box.address,
        port=box.port,
        user=box.user,
        key_filename=key or box.key,
        known_hosts=known_hosts or box.known_hosts,
        host=box.name,
        default_keys=True,
    )

    def say(line: str) -> None:
        click.echo(f"  {line}", err=True)

    try:
        report = Installer(shell, opts, say).run()
    finally:
        shell.close()
    for path, public in report.controller_keys.items():
        click.echo(f"controller key {path} on {box.name}: {public}", err=True)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    elif report.changed:
        click.echo(f"agent on {box.name}: installed orchestrator {report.version} ({report.fingerprint}), ready")
    else:
        click.echo(
            f"agent on {box.name}: nothing to do, orchestrator {report.version} ({report.fingerprint}) "
            "installed and ready"
        )
