"""Two D-Bus systemd adapters in one process share pydbus's system-bus connection (and its one
systemd subscription): both must work, whichever of them subscribed first."""

from __future__ import annotations

import uuid

import pytest

from tests.hosts.machine import Host

pytestmark = pytest.mark.hosts

BOTH = """
import sys
from orchestrator.adapters import connect

unit = sys.argv[1]
_, first = connect("local", host="h")
_, second = connect("local", host="h")
second.start(unit, timeout=30)
print("second started:", first.unit_state(unit).active_state)
first.stop(unit, timeout=30)
print("first stopped:", second.unit_state(unit).active_state)
first.start(unit, timeout=30)
second.stop(unit, timeout=30)
print("both again:", first.unit_state(unit).active_state)
"""


def test_two_dbus_adapters_in_one_process_both_run_jobs(host: Host) -> None:
    """The second adapter's AlreadySubscribed is success: each one starts and stops a unit."""
    unit = f"t-{uuid.uuid4().hex[:8]}.service"
    host.write_file(f"/etc/systemd/system/{unit}", "[Service]\nExecStart=/bin/sleep 1000\n")
    host.run("systemctl daemon-reload")
    out = host.run_python(BOTH, unit, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["second started: active", "first stopped: inactive", "both again: inactive"]
