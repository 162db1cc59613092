"""`agent install`'s controller step on the session's pair of netns hosts: n1 is the controller box, n2
its group's host. The step runs through the installer's SSH connection to the controller, as in a
real install (bootstrap/install.py calls it between the config and the unit).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.adapters.ssh import SshShell
from orchestrator.bootstrap.controller_keys import ControllerKeys, Reach, known_hosts_pattern
from orchestrator.core.catalog import Catalog
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet

pytestmark = pytest.mark.hosts

AUTHORIZED = "/etc/ssh/testhost_authorized_keys"  # the test hosts' sshd AuthorizedKeysFile (sshd -T says so)
KEY, KNOWN = "/etc/orchestrator-ctl-test/controller_ed25519", "/etc/orchestrator-ctl-test/known_hosts"


@pytest.fixture
def pair(netns_pair: HostSet) -> Iterator[tuple[Host, Host]]:
    """(controller, group host); the group host's authorized_keys and the controller's files put back after."""
    box, member = netns_pair.hosts
    before = member.run(f"cat {AUTHORIZED}").stdout
    try:
        yield box, member
    finally:
        member.write_file(AUTHORIZED, before, mode=0o600)
        box.run("rm -rf /etc/orchestrator-ctl-test")


def catalog_of(tmp_path: Path, member: Host) -> Catalog:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path / "state"}"\n[hosts.{member.name}]\naddress = "{member.address}"\n'
        f'ssh_port = {member.port}\nssh_key = "{KEY}"\nknown_hosts = "{KNOWN}"\n'
        f'[groups.inference]\nhosts = ["{member.name}"]\ncanary = 0\n'
    )
    return settings.load(cfg)


def run_step(netns_pair: HostSet, box: Host, catalog: Catalog, reach: Reach | None) -> list[tuple[str, bool, str]]:
    steps: list[tuple[str, bool, str]] = []
    shell = SshShell(
        box.address,
        port=box.port,
        key_filename=str(netns_pair.key_path),
        known_hosts=str(netns_pair.known_hosts_path),
        host=box.name,
    )
    try:
        ControllerKeys(shell, lambda n, c, d: steps.append((n, c, d)), lambda line: None).setup(catalog, reach)
    finally:
        shell.close()
    return steps


def controller_ssh(box: Host, member: Host) -> int:
    """What the controller's agent will do: log in to the group host with its key, host key checked."""
    return box.run(
        f"ssh -i {KEY} -o UserKnownHostsFile={KNOWN} -o StrictHostKeyChecking=yes -o BatchMode=yes "
        f"-p {member.port} root@{member.address} true",
        check=False,
    ).returncode


def test_with_authorize_the_controller_gets_a_key_the_group_host_accepts_and_its_checked_host_key(
    netns_pair: HostSet, pair: tuple[Host, Host], tmp_path: Path
) -> None:
    """The key is generated on the controller, authorized on n2, n2's host key written: the controller
    logs in to n2 with strict host key checking; a second run changes nothing."""
    box, member = pair
    catalog = catalog_of(tmp_path, member)
    reach = Reach(str(netns_pair.key_path), str(netns_pair.known_hosts_path))
    first = run_step(netns_pair, box, catalog, reach)
    assert [(n, c) for n, c, _d in first] == [
        ("controller key", True),
        (f"authorize {member.name}", True),
        (f"known_hosts {member.name}", True),
    ]
    assert "checked connection" in first[2][2]
    public = box.run(f"cat {KEY}.pub").stdout.strip()
    assert public in member.run(f"cat {AUTHORIZED}").stdout.splitlines()
    assert first[1][2].endswith(f"root@{member.name}:{AUTHORIZED}")
    assert controller_ssh(box, member) == 0
    again = run_step(netns_pair, box, catalog, reach)
    assert not any(c for _n, c, _d in again), again


def test_without_authorize_the_key_to_authorize_is_named_and_the_host_key_is_scanned(
    netns_pair: HostSet, pair: tuple[Host, Host], tmp_path: Path
) -> None:
    """No --authorize: the step names n2 and the public line to add there; n2's host key is scanned from
    the controller and is the key n2 really has; the controller cannot log in until it is authorized."""
    box, member = pair
    catalog = catalog_of(tmp_path, member)
    steps = run_step(netns_pair, box, catalog, None)
    public = box.run(f"cat {KEY}.pub").stdout.strip()
    by_name = {n: (c, d) for n, c, d in steps}
    pattern = known_hosts_pattern(catalog.hosts[member.name])
    assert by_name[f"authorize {member.name}"] == (
        False,
        f"not reached (no --authorize): add to the authorized_keys of root@{pattern} the line {public}",
    )
    changed, detail = by_name[f"known_hosts {member.name}"]
    assert changed and "trust on first use" in detail
    real = member.host_key_path.with_name(member.host_key_path.name + ".pub").read_text().split()[:2]
    assert box.run(f"cat {KNOWN}").stdout.split() == [pattern, *real]
    assert controller_ssh(box, member) != 0
