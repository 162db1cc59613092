"""One SSH connection opened and checked in one place: strict host keys from known_hosts, the key file
checked, and one mapping of what connecting raises into TransportError naming the host.

Paramiko only (no fabric, no tenacity): a remote CLI's relay and the agentless box lock open their
session with it, and `orchestrator --host BOX history` loads nothing more; ``SshShell``
(adapters/ssh.py) builds its fabric Connection on the same preparation and mapping.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import paramiko

from orchestrator import userfiles
from orchestrator.adapters.known_hosts import load_known_hosts
from orchestrator.core.records import host_port
from orchestrator.errors import TransportError

CONNECT_TIMEOUT = 10.0


class Endpoint(Protocol):
    """An SSH server and how to log in (client/targets.Target is one)."""

    @property
    def name(self) -> str: ...  # for messages: the host's name, or what the user typed

    @property
    def address(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def user(self) -> str: ...

    @property
    def key(self) -> str | None: ...

    @property
    def known_hosts(self) -> str | None: ...


def prepare(client: paramiko.SSHClient, host: str, known_hosts: str | None, key: str | None) -> None:
    """Strict host keys (an unknown or changed one stops the connection) from known_hosts; the key
    file must be a regular file. TransportError naming the file otherwise."""
    client.set_missing_host_key_policy(paramiko.RejectPolicy())  # fabric installs AutoAddPolicy
    try:
        load_known_hosts(client, known_hosts)
        if key:
            userfiles.check_regular(key)
    except OSError as exc:
        what = f"SSH key {key}" if key and exc.filename == key else f"known_hosts {known_hosts or '~/.ssh/known_hosts'}"
        raise TransportError(f"cannot read {what}: {exc.strerror}", host=host) from exc


@contextmanager
def connect_errors(host: str, where: str, known_hosts: str | None, timeout: float) -> Iterator[None]:
    """The one mapping of what opening an SSH connection raises, into TransportError naming the host."""
    address = where.partition("@")[2]
    try:
        yield
    except paramiko.BadHostKeyException as exc:
        raise TransportError(
            f"SSH host key mismatch for {address}: server offered {exc.key.get_name()} {exc.key.fingerprint}, "
            f"known_hosts {known_hosts or '~/.ssh/known_hosts'} expects {exc.expected_key.fingerprint}",
            host=host,
        ) from exc
    except paramiko.AuthenticationException as exc:
        raise TransportError(f"authentication failed for {where} ({exc})", host=host) from exc
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        raise TransportError(f"SSH connection to {address} {_no_connection(exc)}", host=host) from exc
    except paramiko.SSHException as exc:
        # RejectPolicy: "Server '...' not found in known_hosts"; also protocol/banner errors.
        raise TransportError(f"SSH to {where} failed: {exc}", host=host) from exc
    except TimeoutError as exc:
        raise TransportError(f"SSH connection to {address} timed out after {timeout:g} s", host=host) from exc
    except socket.gaierror as exc:
        # fe80::1%eth9: getaddrinfo cannot resolve a zone that names no interface here
        zone = address.rpartition("]")[0].partition("%")[2] if address.startswith("[") else ""
        why = (
            f"zone {zone} is not a network interface of this machine (`ip link` lists them)"
            if zone and not _interface(zone)
            else exc.strerror or str(exc)
        )
        raise TransportError(f"SSH connection to {address} failed: {why}", host=host) from exc
    except OSError as exc:
        raise TransportError(f"SSH connection to {address} failed: {exc.strerror or exc}", host=host) from exc


def _no_connection(exc: paramiko.ssh_exception.NoValidConnectionsError) -> str:
    """Why no address of the host took the connection, as the system said it: "refused" only when
    every one refused (something answered, nothing listens on the port); an unreachable host or
    network says so."""
    errors = [e for e in exc.errors.values() if isinstance(e, OSError)]
    if errors and all(e.errno == errno.ECONNREFUSED for e in errors):
        return "refused"
    reasons = sorted({e.strerror or str(e) for e in errors if e.errno != errno.ECONNREFUSED})
    return f"failed: {'; '.join(reasons)}" if reasons else f"failed: {exc}"


def _interface(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def tune(transport: paramiko.Transport, keepalive: int) -> None:
    # Nagle's algorithm holds each small SSH request back ~40 ms waiting for an ACK: a switch sends
    # dozens, a relay many small lines.
    transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if keepalive:
        transport.set_keepalive(keepalive)


class SshSession:
    """One authenticated SSH connection to an Endpoint (its key, else the SSH agent's and ~/.ssh's),
    for commands on channels of their own: the agent relay, the agentless box lock."""

    def __init__(self, ep: Endpoint, *, timeout: float = CONNECT_TIMEOUT, keepalive: int = 15) -> None:
        self.name, self.timeout = ep.name, timeout
        self.where = f"{ep.user}@{host_port(ep.address, ep.port)}"
        self._client = paramiko.SSHClient()
        prepare(self._client, ep.name, ep.known_hosts, ep.key)
        own_key = ep.key is not None
        with connect_errors(ep.name, self.where, ep.known_hosts, timeout):
            self._client.connect(
                ep.address,
                port=ep.port,
                username=ep.user,
                key_filename=ep.key,
                look_for_keys=not own_key,
                allow_agent=not own_key,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
            )
        transport = self._client.get_transport()
        if transport is not None:
            tune(transport, keepalive)

    def active(self) -> bool:
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def exec(self, command: str, what: str) -> Any:
        """A channel running ``command`` (a paramiko Channel: sendall, recv, fileno, exit status, stderr)."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError(f"host {self.name} ({self.where}): the SSH connection closed")
        try:
            channel = transport.open_session(timeout=self.timeout)
            channel.exec_command(command)
        except paramiko.SSHException as exc:
            raise TransportError(f"host {self.name} ({self.where}): could not start {what}: {exc}") from exc
        return channel

    def close(self) -> None:
        self._client.close()
