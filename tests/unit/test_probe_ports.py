"""A peer tool already listening on the port a switch's new engine needs: named in preflight, before the
serving model is stopped (the engine could not bind, and the switch stopped the old model only to roll back)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from orchestrator.adapters.local_shell import LocalShell
from orchestrator.deploy.preflight import port_holder


@pytest.fixture()
def listener() -> Iterator[int]:
    """A real TCP listener on loopback held by this test process (not in any vllm-*.service cgroup)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_foreign_listener_on_the_engine_port_is_named(listener: int) -> None:
    """`ss` finds this process on the port: the refusal names the model, address:port, the process and the fix."""
    message = port_holder(LocalShell(), "beta", "127.0.0.1", listener)
    assert message is not None
    assert message.startswith(f"beta's port 127.0.0.1:{listener} is already taken by ((\"python")
    assert f"pid={os.getpid()}" in message
    assert message.endswith(
        "not one of orchestrator's engines: its engine could not listen there, so nothing was "
        "stopped; stop that process or give models.beta.port another port"
    )


def test_a_listener_on_a_wildcard_address_conflicts_too() -> None:
    """A peer bound to 0.0.0.0 takes the port on every address, the engine's included."""
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_holder(LocalShell(), "beta", "127.0.0.1", port) is not None


def test_a_free_port_or_another_address_is_no_conflict(listener: int) -> None:
    """Nothing listening there, or a listener on another loopback address only: the switch goes on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    assert port_holder(LocalShell(), "beta", "127.0.0.1", free) is None
    assert port_holder(LocalShell(), "beta", "127.0.0.2", listener) is None


class EngineCgroups(LocalShell):
    """This machine's shell, reading every process's cgroup as a vllm unit's (as our engines run)."""

    def read_file(self, path: str) -> bytes | None:
        if path.startswith("/proc/") and path.endswith("/cgroup"):
            return b"0::/system.slice/vllm-beta.service\n"
        return super().read_file(path)


def test_a_listener_in_one_of_our_engine_units_is_ours(listener: int) -> None:
    """The serving model's own engine (a redeploy, a tune variant, a sleeper woken) holds its port: no conflict."""
    assert port_holder(EngineCgroups(), "beta", "127.0.0.1", listener) is None


class HandUnitCgroups(LocalShell):
    """Every process read as one of a hand-written unit's, named as the team named it."""

    def read_file(self, path: str) -> bytes | None:
        if path.startswith("/proc/") and path.endswith("/cgroup"):
            return b"0::/system.slice/kimi.service\n"
        return super().read_file(path)


def test_what_the_switch_stops_first_may_hold_the_port(listener: int) -> None:
    """An adopted unit of any name, or an adopted hand-run PID, that this switch stops first: no conflict;
    else named."""
    assert port_holder(HandUnitCgroups(), "beta", "127.0.0.1", listener, units={"kimi.service"}) is None
    assert port_holder(HandUnitCgroups(), "beta", "127.0.0.1", listener, units={"kimi2.service"}) is not None
    assert port_holder(LocalShell(), "beta", "127.0.0.1", listener, pids=[os.getpid()]) is None
