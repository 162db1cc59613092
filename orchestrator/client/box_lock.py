"""Agentless use: a controller driving a box over SSH holds a lock on the box itself.

The lock is a flock on a file in the box's state dir, held by a command on its own SSH connection
for the whole operation: when the controller ends or its connection drops, the command ends and
the lock goes with it. A box whose agent runs is the agent's: an agentless controller refuses
it, naming the agent (unless told to ignore it).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.core.catalog import Host
from orchestrator.errors import Busy, TransportError

LOCK_DIR = "/var/lib/orchestrator"
LOCK_FILE = f"{LOCK_DIR}/agentless.lock"
AGENT_UNIT = "orchestrator-agent.service"
_HELD = 75

_SCRIPT = f"""
if [ "$1" != ignore-agent ] && systemctl is-active --quiet {AGENT_UNIT}; then echo AGENT; exit 0; fi
mkdir -p {LOCK_DIR} && exec flock -n -E {_HELD} {LOCK_FILE} sh -c \\
  'echo "$(id -un) from ${{SSH_CONNECTION%% *}} (pid $$) since $(date -u +%FT%TZ)" > {LOCK_FILE}
   echo LOCKED; exec cat >/dev/null'
"""


@contextmanager
def box_lock(host: Host, *, ignore_agent: bool = False) -> Iterator[None]:
    """Hold the box's agentless lock for the block (hosts reached over SSH; a no-op for local ones)."""
    if host.transport != "ssh":
        yield  # this machine is the box: the per-host flock in the state dir already covers it
        return
    from orchestrator.adapters.ssh_session import SshSession
    from orchestrator.client.targets import Target

    target = Target.of_host(host)
    session = SshSession(target)
    try:
        channel = session.exec(
            f"sh -c {shlex.quote(_SCRIPT)} lock {'ignore-agent' if ignore_agent else 'check'}",
            f"the lock on {LOCK_FILE}",
        )
        first = channel.makefile("rb").readline().decode(errors="replace").strip()
        if first == "AGENT":
            raise Busy(
                f"host {host.name}: its agent ({AGENT_UNIT}) runs on {host.address} and owns the box: "
                f"use `orchestrator --host ssh://{target.where} ...` (or --ignore-agent)",
                host=host.name,
            )
        if first != "LOCKED":
            status = channel.recv_exit_status()
            if status == _HELD:
                holder = session.exec(f"cat {LOCK_FILE}", "a read of the lock's holder").makefile("rb").read()
                raise Busy(
                    f"host {host.name}: another controller holds {LOCK_FILE} on the box "
                    f"({holder.decode(errors='replace').strip() or 'holder unknown'}); try again when it "
                    "is done",
                    host=host.name,
                )
            err = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
            raise TransportError(f"host {host.name}: could not take {LOCK_FILE} (exit {status}): {err}", host=host.name)
        yield
    finally:
        session.close()  # the box's `cat` sees EOF, flock exits, the lock is free
