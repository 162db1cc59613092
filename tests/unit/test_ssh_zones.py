"""`--host ssh://[fe80::1%eth0]`: an IPv6 address with a zone (the interface of this machine it is reached
through) is an SSH target end to end, as paramiko's getaddrinfo takes it; messages bracket it."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.adapters.ssh import SshShell
from orchestrator.adapters.ssh_session import SshSession
from orchestrator.client.targets import Target, parse_url
from orchestrator.errors import TransportError, UsageError


def test_a_zone_parses_in_both_spellings() -> None:
    """`%eth0` as ssh and ip write it, and RFC 6874's `%25eth0` in a URL, are the same address."""
    assert parse_url("ssh://ops@[fe80::1%eth0]:2200").address == "fe80::1%eth0"
    assert parse_url("ssh://[fe80::1%25eth0]").address == "fe80::1%eth0"


@pytest.mark.parametrize(
    "bad,words",
    [
        ("ssh://[fe80::1%]", ["empty zone"]),
        ("ssh://[fe80::1%25]", ["empty zone"]),
        ("ssh://[fe80::1%eth 0]", ["zone 'eth 0'", "interface name"]),
        ("ssh://[fe80::1%a/b]", ["fe80::1%a/b"]),
        ("ssh://[fe80::1%abcdefghijklmnop]", ["zone 'abcdefghijklmnop'", "at most 15"]),
    ],
)
def test_a_bad_zone_is_refused_naming_it(bad: str, words: list[str]) -> None:
    """A zone that no interface can be named: exit 2 naming the URL and the zone."""
    with pytest.raises(UsageError) as info:
        parse_url(bad)
    assert str(info.value).startswith(f"--host {bad!r}") and all(w in str(info.value) for w in words), info.value
    assert info.value.exit_code == 2


def test_where_brackets_an_ipv6_address() -> None:
    """user@[address%zone]:port, never the ambiguous user@fe80::1%eth0:22."""
    assert parse_url("ssh://ops@[fe80::1%eth0]:2200").where == "ops@[fe80::1%eth0]:2200"
    assert parse_url("ssh://box").where == "root@box:22"


def test_a_zoned_address_is_dialled_through_its_interface(tmp_path: Path) -> None:
    """paramiko dials fe80::1%lo through lo (no traffic leaves the machine; nothing has that address there):
    the kernel answers unreachable, where the same address without its zone is not even a valid target."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    target = parse_url("ssh://[fe80::1%lo]:2222")
    with pytest.raises(TransportError) as session_err:
        SshSession(Target(name="box", address=target.address, port=2222, known_hosts=str(known)))
    with pytest.raises(TransportError) as shell_err:
        SshShell(target.address, port=2222, host="box", known_hosts=str(known)).connect()
    assert (
        str(session_err.value)
        == str(shell_err.value)
        == "host box: SSH connection to [fe80::1%lo]:2222 failed: Network is unreachable"
    )


def test_a_zone_on_an_address_that_is_not_link_local_is_refused() -> None:
    """[::1%lo]: getaddrinfo takes interface names only for link-local addresses: exit 2 naming it."""
    with pytest.raises(UsageError, match=r"zone %lo on ::1: a zone is for a link-local address"):
        parse_url("ssh://[::1%lo]")


def test_a_zone_that_is_no_interface_here_is_named() -> None:
    """A zone this machine has no interface for: exit 4 naming the zone, not getaddrinfo's bare words."""
    with pytest.raises(TransportError) as info:
        SshSession(Target(name="box", address="fe80::1%nosuchif0", port=22))
    assert "zone nosuchif0 is not a network interface of this machine" in str(info.value), info.value
