"""Which interpreter runs the product's workers (stage, proxy CLI) on a host."""

from __future__ import annotations

from orchestrator.client.targets import DEFAULT_PYTHON
from orchestrator.core.catalog import Host
from orchestrator.core.catalog_hosts import INSTALLED_PYTHON
from orchestrator.wiring import host_python

AGENT = "/opt/orchestrator/venvs/abc123/bin/python"


def test_a_local_host_without_python_uses_the_agents_own() -> None:
    """Unset on the agent's own box: the agent's interpreter, which has the product (/usr/bin/python3 has not)."""
    assert host_python(Host(name="box", transport="local"), own=AGENT) == AGENT


def test_an_ssh_host_without_python_uses_the_installed_venv() -> None:
    """Unset over SSH: the venv `agent install` made there."""
    assert host_python(Host(name="box", transport="ssh"), own=AGENT) == INSTALLED_PYTHON


def test_the_relay_and_the_workers_default_to_the_same_venv() -> None:
    """The hosts file's default python (the relay's) is the installed venv the workers default to."""
    assert DEFAULT_PYTHON == INSTALLED_PYTHON


def test_a_set_python_wins() -> None:
    """The operator's `python` is used on either transport."""
    for transport in ("local", "ssh"):
        assert (
            host_python(Host(name="box", transport=transport, python="/srv/py/bin/python"), own=AGENT)
            == "/srv/py/bin/python"
        )
