"""Real test hosts: systemd as PID 1, D-Bus and sshd, booted with systemd-nspawn on loopback."""

from tests.hosts.machine import Host, HostError
from tests.hosts.pool import HostSet, boot_hosts

__all__ = ["Host", "HostError", "HostSet", "boot_hosts"]
