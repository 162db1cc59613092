"""The agent's servers (control, demand, dashboard) bind at a path from deploy.toml as root: before the
bind they remove only a stale socket of their own, refusing anything else by name, and at the end only
the socket they bound."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import unix_sockets
from orchestrator.agent.daemon import Agent
from orchestrator.agent.demand_server import DemandServer
from orchestrator.agent.server import ControlServer
from orchestrator.dashboard.server import DashboardServer
from orchestrator.dashboard.service import start
from orchestrator.errors import AgentError

from .conftest import OpsWorld

SERVERS: dict[str, Callable[[str], Any]] = {
    "control": lambda path: ControlServer(path, SimpleNamespace(group="root")),
    "demand": lambda path: DemandServer(path, SimpleNamespace(), uids=[0]),
    "dashboard": lambda path: DashboardServer(path, SimpleNamespace(), SimpleNamespace(live=None)),
}


def _stale_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # bound, never listened on: what a crashed agent leaves


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_file_at_the_socket_path_is_refused_and_kept(tmp_path: Path, server: str) -> None:
    """A regular file where a server would bind is named in the error and left as it was."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    with pytest.raises(AgentError, match=f"{victim}: a regular file is there, not a socket"):
        SERVERS[server](str(victim))
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_symlink_at_the_socket_path_is_refused_and_kept(tmp_path: Path, server: str) -> None:
    """A symlink where a server would bind is refused: neither it nor its target is removed."""
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    with pytest.raises(AgentError, match="a symbolic link is there"):
        SERVERS[server](str(link))
    assert link.is_symlink() and target.read_text() == "precious\n"


@pytest.mark.parametrize("server", list(SERVERS))
def test_a_stale_socket_of_the_agents_own_is_replaced(tmp_path: Path, server: str) -> None:
    """A socket of this user's that nothing listens on (a crashed agent's) is removed and bound again."""
    path = tmp_path / "x.sock"
    _stale_socket(path)
    srv = SERVERS[server](str(path))
    try:
        assert path.is_socket() and unix_sockets.bound(str(path)) == srv.bound
    finally:
        srv.server_close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chowns a socket to another user")
def test_another_users_socket_is_refused_and_kept(tmp_path: Path) -> None:
    """A stale socket owned by another uid is not the agent's to remove."""
    path = tmp_path / "x.sock"
    _stale_socket(path)
    os.chown(path, 65534, 65534)
    with pytest.raises(AgentError, match="a socket of uid 65534 is there"):
        unix_sockets.clear_stale(str(path), "dashboard socket")
    assert path.is_socket()


def test_a_live_socket_is_refused(tmp_path: Path) -> None:
    """A socket something listens on (another agent) is refused, naming the path."""
    path = tmp_path / "x.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen()
    try:
        with pytest.raises(AgentError, match=f"{path}: something already listens there"):
            unix_sockets.clear_stale(str(path), "agent socket")
    finally:
        live.close()


def test_close_leaves_a_file_put_at_the_path_since(tmp_path: Path) -> None:
    """At the end a server removes its own socket only: what replaced it at the path stays."""
    path = tmp_path / "x.sock"
    srv = SERVERS["dashboard"](str(path))
    srv.server_close()
    path.unlink()
    path.write_text("someone else's\n")
    unix_sockets.remove(srv.bound)
    assert path.read_text() == "someone else's\n"


def test_the_agent_does_not_delete_a_file_named_as_its_dashboard_socket(tmp_path: Path) -> None:
    """`[dashboard] socket` naming a file: the dashboard stays off, the file stays whole."""
    victim = tmp_path / "victim-file.sock"  # a name the catalog takes: the check is the server's
    victim.write_text("precious\n")
    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(victim)})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    assert start(agent) is None
    assert victim.read_text() == "precious\n" and victim.stat().st_mode & 0o777 != 0o666
