"""Test hosts are separate machines as far as systemd can tell: the same unit runs on all at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.hosts.machine import Host
from tests.hosts.pool import HostSet

pytestmark = pytest.mark.hosts

CYCLE = (
    "systemd-run --unit=fleet-same.service --property=KillMode=control-group sleep 600 && "
    "systemctl kill fleet-same.service && "
    "timeout 20 sh -c 'while systemctl is-active -q fleet-same.service; do sleep 0.05; done'; "
    "systemctl reset-failed fleet-same.service 2>/dev/null; "
    "systemd-run --unit=fleet-same.service sleep 600 && systemctl stop fleet-same.service"
)


@pytest.fixture(scope="module")
def four(netns_fleet: HostSet) -> HostSet:
    """The session's four hosts (network namespaces of their own change nothing in what systemd sees)."""
    return netns_fleet


def _cycles(host: Host, n: int) -> list[str]:
    failures = []
    for i in range(n):
        proc = host.run(CYCLE, check=False, timeout=60)
        if proc.returncode != 0:
            failures.append(f"{host.name} cycle {i}: exit {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return failures


def test_same_unit_name_starts_and_is_killed_on_four_hosts_at_once(four: HostSet) -> None:
    """Five start/kill/start/stop cycles of one unit name on 4 hosts concurrently: none fails."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for fs in pool.map(lambda h: _cycles(h, 5), four.hosts) for f in fs]
    assert failures == []


def test_each_host_has_a_cgroup_tree_of_its_own(four: HostSet) -> None:
    """A unit started on one host shows in that host's cgroup only, not in another's."""
    a, b = four.hosts[0], four.hosts[1]
    a.run("systemd-run --unit=fleet-only-a.service sleep 600")
    try:
        path = a.run("systemctl show -p ControlGroup --value fleet-only-a.service").stdout.strip()
        assert path.endswith("/fleet-only-a.service")
        assert b.run(f"test -d /sys/fs/cgroup/unified{path}", check=False).returncode != 0
        assert b.run("systemctl is-active fleet-only-a.service", check=False).stdout.strip() != "active"
    finally:
        a.run("systemctl stop fleet-only-a.service", check=False)
