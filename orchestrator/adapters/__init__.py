"""Adapters behind the ports; ``connect`` builds a host's Shell and Systemd in one call.

    shell, systemd = connect("ssh", "10.0.0.5", key_filename="~/.ssh/id_ed25519",
                             known_hosts="~/.ssh/known_hosts", host="gpu3")
    shell, systemd = connect("local")      # on the box itself: subprocess + D-Bus (pydbus)

pydbus is imported only for "local", so the SSH path needs no GObject stack.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal

from orchestrator.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.ports import Shell, Systemd


def connect(
    transport: Literal["local", "ssh"],
    address: str = "localhost",
    *,
    port: int = 22,
    user: str = "root",
    key_filename: str | None = None,
    known_hosts: str | None = None,
    unit_dir: str | None = None,
    host: str | None = None,
    connect_timeout: float = 10.0,
) -> tuple[Shell, Systemd]:
    """The (Shell, Systemd) pair of one host.

    transport "ssh": one persistent SSH connection (opened now, so a bad address, key or host
    key fails here with TransportError), host keys checked against ``known_hosts`` (default
    ~/.ssh/known_hosts) and never added. transport "local": this machine, systemd over D-Bus.
    ``host`` is the name used in messages (default: the address); ``unit_dir``: /etc/systemd/system.
    """
    # Imported here, not at the top: the package's modules (ssh_session for a remote CLI) load alone.
    from orchestrator.adapters.unit_files import DEFAULT_UNIT_DIR

    name, unit_dir = host or address, unit_dir or DEFAULT_UNIT_DIR
    if transport == "local":
        from orchestrator.adapters.local_shell import LocalShell

        try:
            from orchestrator.adapters.systemd_dbus import DbusSystemd
        except ImportError as exc:  # the optional D-Bus stack (pydbus, PyGObject) is not installed
            raise ConfigError(
                f"host {name}: transport 'local' drives systemd over D-Bus, which needs the "
                f"extra orchestrator[dbus] (pip install 'orchestrator[dbus]'): "
                f"{exc.name or 'pydbus'} is not installed"
            ) from exc

        local = LocalShell(name)
        return local, DbusSystemd(local, unit_dir)
    if transport == "ssh":
        from orchestrator.adapters.ssh import SshShell
        from orchestrator.adapters.systemd_ssh import SshSystemd

        remote = SshShell(
            address,
            port=port,
            user=user,
            host=name,
            connect_timeout=connect_timeout,
            key_filename=os.path.expanduser(key_filename) if key_filename else None,
            known_hosts=os.path.expanduser(known_hosts) if known_hosts else None,
        )
        remote.connect()
        return remote, SshSystemd(remote, unit_dir)
    raise ConfigError(f"transport {transport!r} is not 'local' or 'ssh'", key="transport")
