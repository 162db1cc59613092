"""`orchestrator dashboard` on the box itself: the real CLI in a subprocess, the agent in this process (over
fake ports) on its real sockets. It forwards only when an agent serves a dashboard, and says why not."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.agent.server import ControlServer
from tests.builders.catalog import ONE_BOX_TOML

from .conftest import OpsWorld

TOML = ONE_BOX_TOML


def run_cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "dashboard", "--no-open", "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "ORCHESTRATOR_HOST": ""},
    )


@contextmanager
def agent_on(tmp_path: Path, **dashboard: object) -> Iterator[Agent]:
    world = OpsWorld(tmp_path / "state", dashboard=dashboard)
    agent = Agent(world.catalog, world.ops, metrics_port=None, clock=world.clock)
    server = ControlServer(agent.socket, agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    dash = agent._start_dashboard()
    yield agent
    if dash is not None:
        dash.close()
    server.shutdown()
    server.server_close()


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(TOML.format(state=tmp_path / "state", extra=""))
    return path


def test_without_an_agent_it_says_so_and_exits_6(cfg: Path) -> None:
    """No agent on this box: nothing to forward; exit 6 with the way out."""
    r = run_cli(cfg)
    assert r.returncode == 6 and "no agent runs here to serve a dashboard" in r.stderr and r.stdout == ""


def test_an_agent_with_the_dashboard_off_says_so_and_exits_6(cfg: Path, tmp_path: Path) -> None:
    """[dashboard] enabled = false: the CLI names the setting instead of forwarding to nothing."""
    with agent_on(tmp_path, enabled=False):
        r = run_cli(cfg)
    assert r.returncode == 6 and "enabled = false" in r.stderr


def test_a_taken_port_is_bad_input_naming_it(cfg: Path, tmp_path: Path) -> None:
    """--port that is in use: exit 2, naming the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with agent_on(tmp_path):
            r = run_cli(cfg, "--port", str(port))
    assert r.returncode == 2 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in r.stderr


def test_the_printed_url_opens_the_agents_page(cfg: Path, tmp_path: Path) -> None:
    """The command prints a loopback URL with a token; opening it gets the box page of this agent."""
    with agent_on(tmp_path):
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator", "dashboard", "--no-open", "--config", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "ORCHESTRATOR_HOST": ""},
        )
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:") and "token=" in url
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
            page = opener.open(url, timeout=30).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert 'data-model="alpha" data-state="stopped"' in page
