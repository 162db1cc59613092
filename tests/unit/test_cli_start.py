"""What a query loads before its first request: through the agent, deploy.toml is read as TOML for the
socket (the agent checks the request against its own catalog), so neither pydantic nor the catalog
nor the deploy stack loads; `--host` loads paramiko but not fabric; in-process, a bad file is exit 2."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.core.catalog import Catalog
from tests.builders.agent_socket import StandInAgent
from tests.builders.catalog import ONE_BOX_TOML

HEAVY = ("pydantic", "pydantic_settings", "orchestrator.core.catalog", "orchestrator.deploy", "fabric", "tenacity")
PROBE = (
    "import json, sys\nfrom orchestrator.cli import main\n"
    "try:\n    main(sys.argv[1:])\nexcept SystemExit as exc:\n    code = exc.code\n"
    f"print(json.dumps([sorted(m for m in {HEAVY!r} if m in sys.modules), code]), file=sys.stderr)"
)


# What an idle agent answers to the queries the CLI sends it.
IDLE_AGENT = {"ping": {}, "status": {"hosts": {}, "schedules": []}, "history": []}


@pytest.fixture
def box(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    config = tmp_path / "deploy.toml"
    config.write_text(ONE_BOX_TOML.format(state=tmp_path / "state", extra=""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    yield config, {**env, "ORCHESTRATOR_CONFIG": str(config), "ORCHESTRATOR_SOCKET": str(tmp_path / "agent.sock")}


def probe(env: dict[str, str], *argv: str) -> tuple[list[str], int | str | None, str]:
    """(the heavy modules loaded, exit code, output) of one CLI run in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, check=False)
    loaded, code = json.loads(proc.stderr.strip().splitlines()[-1])  # the probe's own last line
    return loaded, code, proc.stdout + proc.stderr


@pytest.mark.parametrize("command", ["status", "history"])
def test_a_query_through_the_agent_loads_no_catalog(
    box: tuple[Path, dict[str, str]], tmp_path: Path, command: str
) -> None:
    """`status` and `history` with an agent on the socket ask it, loading neither pydantic nor the catalog."""
    agent = StandInAgent(tmp_path / "agent.sock", IDLE_AGENT)
    loaded, code, out = probe(box[1], command)
    assert (loaded, code) == ([], 0), out
    assert agent.ops == ["ping", command]


def test_the_agent_answers_a_query_whatever_the_local_catalog_says(
    box: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A deploy.toml the catalog would refuse still names the socket: the agent's own file rules."""
    config, env = box
    config.write_text(config.read_text() + "bogus_key = 1\n")
    agent = StandInAgent(tmp_path / "agent.sock", IDLE_AGENT)
    _, code, out = probe(env, "history")
    assert code == 0 and "no deployments recorded yet on host box" in out
    assert agent.ops == ["ping", "history"]


def test_a_bad_deploy_toml_without_an_agent_is_refused_with_its_key(box: tuple[Path, dict[str, str]]) -> None:
    """With no agent to ask, the query loads the catalog: exit 2 naming the file and the unknown key."""
    config, env = box
    config.write_text(config.read_text() + "[models.alpha.extra]\nx = 1\n")
    _, code, out = probe(env, "status")
    assert code == 2 and f"{config}" in out and "models.alpha.extra: unknown key" in out, out


def test_host_loads_paramiko_without_fabric(box: tuple[Path, dict[str, str]]) -> None:
    """`--host` to a box whose port refuses: exit 4, with neither fabric, tenacity nor pydantic loaded."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    loaded, code, out = probe(box[1], "--host", f"ssh://bench@127.0.0.1:{port}", "history")
    assert (loaded, code) == ([], 4), out


def _close_each(server: socket.socket) -> None:
    try:
        while True:
            server.accept()[0].close()
    except OSError:
        return  # the test closed the listener


def test_host_to_a_port_that_speaks_no_ssh_prints_one_line(box: tuple[Path, dict[str, str]]) -> None:
    """A listener that closes at once: exit 4 and the one mapped error line, no library traceback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=_close_each, args=(server,), daemon=True).start()
        port = server.getsockname()[1]
        _, code, out = probe(box[1], "--host", f"ssh://bench@127.0.0.1:{port}", "history")
    lines = [line for line in out.splitlines() if line.strip()][:-1]  # the probe's own line last
    assert code == 4 and len(lines) == 1 and lines[0].startswith("error: host ssh://bench@127.0.0.1"), out


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('state_dir = "relative/state"\n', "a relative state_dir"),
        ("state_dir = 7\n", "a state_dir that is not text"),
        ("state_dir = \n", "not TOML"),
        ('hosts = "box"\n', "hosts that are not a table"),
    ],
)
def test_peek_leaves_what_is_not_plain_to_the_catalog(tmp_path: Path, text: str, why: str) -> None:
    """peek() says None (the caller validates and gets the catalog's exit-2 error) for {why}."""
    (tmp_path / "deploy.toml").write_text(text)
    assert settings.peek(tmp_path / "deploy.toml") is None, why


def test_peek_reads_state_dir_as_the_catalog_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default and the environment's override are the catalog's; hosts by name."""
    (tmp_path / "deploy.toml").write_text("[hosts.b]\n[hosts.a]\n")
    monkeypatch.delenv("ORCHESTRATOR_STATE_DIR", raising=False)
    peeked = settings.peek(tmp_path / "deploy.toml")
    assert peeked == settings.Peek(Catalog.model_fields["state_dir"].default, ("a", "b"))
    monkeypatch.setenv("orchestrator_state_dir", "/srv/state")
    assert settings.peek(tmp_path / "deploy.toml") == settings.Peek("/srv/state", ("a", "b"))
