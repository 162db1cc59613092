"""pytest fixtures over the harness: one set of hosts per session, reset after every test.

    def test_x(host):            # h1, reset (test units removed) after the test
    def test_y(hosts):           # [h1, h2], reset after the test
    def test_z(host_set):        # the session's HostSet (key_path, known_hosts_path, hosts)
    def test_w(adapters):        # run twice: adapters.shell/.systemd built by connect("local")
                                 # inside h1 (D-Bus) and by connect("ssh") from here
    netns_pair                   # two hosts in network namespaces of their own, booted once per
                                 # session for every module that needs a pair across a network
                                 # (multinode, Ray, remote CLI); each module resets them after a test

TESTHOSTS_COUNT (default 2) sets how many hosts the session boots.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.adapters import connect
from orchestrator.testing import FakeHost, FakeShell, FakeSystemd
from tests.hosts.inside import InsideAdapters
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet, boot_hosts


@pytest.fixture(scope="session")
def host_set() -> Iterator[HostSet]:
    """Boots the session's hosts in parallel on first use; torn down at session end."""
    with boot_hosts(int(os.environ.get("TESTHOSTS_COUNT", "2"))) as hostset:
        yield hostset


@pytest.fixture(scope="session")
def netns_fleet() -> Iterator[HostSet]:
    """Four hosts behind a bridge, each in its own network namespace; booted on first use and shared by
    the modules that need four boxes (rollouts, the fleet page, host isolation) or two (netns_pair),
    which reset them after a test (a boot costs ~12 s on a busy machine); torn down at session end."""
    with boot_hosts(4, netns=True) as hostset:
        yield hostset


@pytest.fixture(scope="session")
def netns_pair(netns_fleet: HostSet) -> HostSet:
    """h1 and h2 of netns_fleet, as a set of their own (same key, known_hosts and bridge) for the
    modules that need two hosts across a network; never closed itself (netns_fleet owns the hosts)."""
    return HostSet(hosts=netns_fleet.hosts[:2], key_dir=netns_fleet.key_dir, bridge=netns_fleet.bridge)


@pytest.fixture
def hosts(host_set: HostSet) -> Iterator[list[Host]]:
    """Every host of the session, each reset after the test so tests never see each other."""
    yield host_set.hosts
    with ThreadPoolExecutor(max_workers=len(host_set.hosts)) as pool:
        for fut in [pool.submit(h.reset) for h in host_set.hosts]:
            fut.result()


@pytest.fixture
def host(hosts: list[Host]) -> Host:
    """The first host (h1), reset after the test."""
    return hosts[0]


@dataclass
class Adapters:
    """A host's Shell and Systemd as the orchestrator would build them, plus the host itself."""

    kind: str  # "local": connect("local") running inside the host; "ssh": connect("ssh") from here; "fake"
    host: Any  # the booted Host; for "fake" the FakeHost world (it has a name, no processes)
    shell: Any
    systemd: Any


# For the cases a fake can honour (no processes, no look at the host from outside): the fakes of
# orchestrator.testing run them too, so the unit tests' fakes keep the real adapters' contract.
WITH_FAKES = pytest.mark.parametrize("adapters", ["local", "ssh", "fake"], indirect=True)


@pytest.fixture(scope="session")
def inside_adapters() -> Iterator[dict[str, InsideAdapters]]:
    """The in-host adapter process of each host, by address, kept for the session: a start costs
    ~0.7 s (Python, orchestrator and pydbus imported in the host), and the adapters hold nothing
    between calls that a test could leave behind (the agent, too, keeps one pair for its lifetime)."""
    running: dict[str, InsideAdapters] = {}
    yield running
    for inside in running.values():
        inside.close()


@pytest.fixture(params=["local", "ssh"])
def adapters(request: pytest.FixtureRequest) -> Iterator[Adapters]:
    """Both adapter pairs against h1: the contract suites run once per transport (WITH_FAKES: and
    against the fakes, without booting a host)."""
    if request.param == "fake":
        world = FakeHost(name="h1")
        yield Adapters("fake", world, FakeShell(world), FakeSystemd(world))
        return
    host: Host = request.getfixturevalue("host")
    if request.param == "local":
        running: dict[str, InsideAdapters] = request.getfixturevalue("inside_adapters")
        inside = running.get(host.address)
        if inside is None or not inside.alive():  # first use, or a test ended the process
            inside = running[host.address] = InsideAdapters(host)
        yield Adapters("local", host, inside.shell, inside.systemd)
    else:
        shell, systemd = connect(
            "ssh",
            host.address,
            port=host.port,
            user=host.user,
            key_filename=str(host.key_path),
            known_hosts=str(host.known_hosts_path),
            host=host.name,
        )
        try:
            yield Adapters("ssh", host, shell, systemd)
        finally:
            shell.close()
