"""The lock and activity readers on an overlayfs root (a test host's, as Docker's, Kubernetes' and
systemd-nspawn's): /proc/locks names the file by the overlay's device, stat by a layer's."""

from __future__ import annotations

import json

import pytest

from tests.hosts.machine import Host

pytestmark = pytest.mark.hosts

STATE = "/var/lib/locks-check"  # in the host's root, an overlay
READ = """
import json, sys
from orchestrator.deploy.locks import activity_holder, activity_lock, host_held, host_lock
state = sys.argv[1]
seen = {"before": host_held(state, "box")}
with host_lock(state, "box"), activity_lock(state, "box", "bench", "a bench of alpha is running"):
    seen["held"], seen["holder"] = host_held(state, "box"), activity_holder(state, "box", "bench")
seen["after"], seen["free"] = host_held(state, "box"), activity_holder(state, "box", "bench")
print(json.dumps(seen))
"""


def test_held_locks_are_seen_held_on_an_overlay_root(host: Host) -> None:
    """host_held and activity_holder see the locks an operation holds on an overlay, and free after."""
    assert host.run(["stat", "-f", "-c", "%T", "/var/lib"]).stdout.strip() == "overlayfs"
    host.run(["rm", "-rf", STATE])
    seen = json.loads(host.run_python(READ, STATE).stdout)
    assert seen["before"] is False and seen["held"] is True and seen["after"] is False
    assert seen["holder"].startswith("a bench of alpha is running since ") and seen["free"] is None
