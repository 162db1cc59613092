"""The CLI's command registry: every command listed once, loaded on demand, summarised truthfully."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from orchestrator.cli import COMMANDS, load_command, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_registered_command_loads_under_its_name(name: str) -> None:
    """Each registry entry loads a click command of that name."""
    assert load_command(name).name == name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_summary_is_the_commands_own_first_sentence(name: str) -> None:
    """The summary `--help` lists is the one the command's docstring starts with."""
    assert COMMANDS[name][2] == load_command(name).get_short_help_str(limit=1000)


def test_help_imports_no_command_module() -> None:
    """`orchestrator --help` lists every command without importing the modules that define them."""
    probe = (
        "import sys; from orchestrator.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('orchestrator.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]"
    assert all(f"  {name} " in out for name in COMMANDS)


def test_unknown_command_is_refused_by_name() -> None:
    """A name not in the registry is a usage error that names it."""
    result = CliRunner().invoke(main, ["nosuch"])
    assert result.exit_code == 2 and "No such command 'nosuch'" in result.output
