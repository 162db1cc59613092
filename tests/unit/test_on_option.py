"""`--host` means one thing: the SSH box, before the command. A host of deploy.toml is named with `--on`
after the command; the old per-command `--host` is refused (exit 2) naming `--on`."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from orchestrator.cli import main

# every command that acts on one host of deploy.toml
COMMANDS = ["bench", "compare", "rollback", "recover", "status", "history", "doctor", "plan", "tune"]


def _command(name: str) -> click.Command:
    group = main
    assert isinstance(group, click.Group)
    ctx = click.Context(group)
    cmd = group.get_command(ctx, name)
    assert cmd is not None
    return cmd


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_names_its_catalog_host_with_on(name: str) -> None:
    opts = {o for p in _command(name).params for o in p.opts}
    shown = {o for p in _command(name).params if not getattr(p, "hidden", False) for o in p.opts}
    assert "--on" in shown and "--host" in opts and "--host" not in shown


@pytest.mark.parametrize("name", COMMANDS)
def test_the_old_per_command_host_is_refused_naming_on(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--host", "gpu1"])
    assert result.exit_code == 2
    assert f"`orchestrator {name} --on gpu1`" in result.output
    assert f"`orchestrator --host BOX {name}`" in result.output
