"""The state directory keeps the modes the docs promise (0750, the socket group) whichever part of
the product opens it: the agent's operations, its config revisions, tune and rollouts."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.deploy.operations import Operations
from orchestrator.ports import HostPorts
from orchestrator.rollout.fleet import Fleet
from orchestrator.rollout.tune import tune_store
from orchestrator.testing import FakeClock

from .conftest import make_catalog

GROUP = "daemon"  # any group but root's own: the directory's gid must be the socket group's

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the socket group needs root")


def no_ports(name: str) -> HostPorts:
    raise AssertionError(f"no host is reached by opening the state ({name})")


def modes(state: Path) -> dict[str, tuple[int, str]]:
    """Mode and group of the directory and of every database file in it."""
    return {
        p.name: (stat.S_IMODE(p.stat().st_mode), grp.getgrgid(p.stat().st_gid).gr_name)
        for p in [state, *sorted(state.glob("*.db*"))]
    }


def test_agent_start_leaves_the_state_dir_to_the_socket_group(tmp_path: Path) -> None:
    """Starting an agent (operations, then config revisions in the same state.db) keeps 0750 and the group."""
    state = tmp_path / "state"
    cfg = tmp_path / "deploy.toml"
    cfg.write_text("# the agent's file\n")
    catalog = make_catalog(state_dir=str(state), socket_group=GROUP)
    Agent(
        catalog,
        Operations(catalog, no_ports),
        socket=str(state / "agent.sock"),
        metrics_port=None,
        clock=FakeClock(),
        config_path=str(cfg),
    )
    assert modes(state)[state.name] == (0o750, GROUP)
    assert all(mode == 0o600 for name, (mode, _) in modes(state).items() if name != state.name)


def test_tune_and_rollout_stores_keep_the_state_dir_modes(tmp_path: Path) -> None:
    """Opening the tune store and the rollout store after the agent leaves the directory 0750 and its
    files 0600 (rollouts.db included)."""
    state = tmp_path / "state"
    catalog = make_catalog(state_dir=str(state), socket_group=GROUP)
    Operations(catalog, no_ports)
    tune_store(catalog).close()
    Fleet(catalog)
    seen = modes(state)
    assert seen.pop(state.name) == (0o750, GROUP)
    assert "rollouts.db" in seen
    assert {mode for mode, _ in seen.values()} == {0o600}
