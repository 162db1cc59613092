"""Who a caller is, read on a real host: a non-root SSH login's address comes from sshd's own
connection (the root-owned [priv] monitor), whatever the login's SSH_CONNECTION says."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.machine import Host
from tests.hosts.pool import HostSet
from tests.hosts.wait import wait_for

pytestmark = pytest.mark.hosts
REPO = str(Path(__file__).resolve().parents[1])  # bind-mounted at the same path inside test hosts


@pytest.fixture(scope="module")
def host(host_set: HostSet) -> Iterator[Host]:
    """The session's h1 with a user alice (a boot of its own cost ~12 s more); alice removed after."""
    h = host_set.hosts[0]
    # '*': no password, not locked
    h.run("id alice >/dev/null 2>&1 || useradd -m -s /bin/sh alice; usermod -p '*' alice")
    yield h
    h.run("pkill -KILL -u alice; userdel -r alice", check=False)


def operator_inside(host: Host, pid: str, user: str) -> str:
    code = (
        "import pwd; from orchestrator.agent.peers import operator; "
        f"print(operator({pid}, pwd.getpwnam({user!r}).pw_uid))"
    )
    return host.run(f"cd {shlex.quote(REPO)} && {shlex.quote(sys.executable)} -c {shlex.quote(code)}").stdout.strip()


@pytest.mark.parametrize("user", ["alice", "root"])
def test_a_login_is_named_by_sshds_connection_not_its_own_environment(host: Host, user: str) -> None:
    """A login that forges SSH_CONNECTION=6.6.6.6 is still user@<its real address>."""
    marker = f"sleep 3{len(user)}7"  # a command line of this test's own, to find the process by
    login = subprocess.Popen(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(host.key_path),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            f"UserKnownHostsFile={host.known_hosts_path}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-p",
            str(host.port),
            f"{user}@{host.address}",
            f"SSH_CONNECTION='6.6.6.6 1 2 3' exec {marker}",
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        pid = wait_for(
            lambda: host.run(["pgrep", "-u", user, "-f", f"^{marker}$"], check=False).stdout.split(),
            bool,
            what=f"{user}'s login process",
        )[0]
        assert operator_inside(host, pid, user) == f"{user}@127.0.0.1"
    finally:
        login.kill()
        login.wait()
