"""core/socket_access.py: the path chain a socket's reachability is checked along, and what an account lacks on it."""

from __future__ import annotations

import stat

import pytest

from orchestrator.core.socket_access import Account, Entry, missing_access, path_chain

HAPROXY = Account("haproxy", 120, frozenset({130}))


def test_the_chain_runs_from_the_root_down_to_the_socket() -> None:
    """/, each directory down, then the socket: the order the kernel searches them."""
    assert path_chain("/run/orchestrator/demand.sock") == [
        "/",
        "/run",
        "/run/orchestrator",
        "/run/orchestrator/demand.sock",
    ]


def test_the_chain_of_a_path_with_doubled_slashes_is_the_same() -> None:
    """`//run///x.sock` names the same directories as `/run/x.sock` (no empty step, no doubled slash)."""
    assert path_chain("//run///x.sock") == path_chain("/run/x.sock") == ["/", "/run", "/run/x.sock"]


def test_a_relative_path_has_no_chain() -> None:
    """A relative socket path is refused, naming it (its chain would depend on the working directory)."""
    with pytest.raises(ValueError, match="'run/x.sock' is not absolute"):
        path_chain("run/x.sock")


def test_the_first_directory_closed_to_the_account_is_named() -> None:
    """Entries built from the chain: the directory without search for haproxy's class is the one named."""
    modes = {"/": 0o755, "/run": 0o755, "/run/o": 0o750, "/run/o/d.sock": 0o660}
    chain = [
        Entry(p, (stat.S_IFSOCK if p.endswith(".sock") else stat.S_IFDIR) | modes[p], 0, 0, "root", "root")
        for p in path_chain("/run/o/d.sock")
    ]
    assert missing_access(chain, HAPROXY) == (
        "search (x) on directory /run/o (drwxr-x--- root:root; haproxy is among its others)"
    )
