"""The CLI as a client of a box's agent over SSH: one connection, a relay channel per request.

Each request opens a channel on the one SSH connection and runs the relay there
(``python -m orchestrator.agent.relay``), which pipes it to the agent's Unix socket; the JSON
lines are the same as on the box. Host keys are checked against known_hosts and never added.
"""

from __future__ import annotations

import shlex
import socket
from typing import Any

import paramiko

from orchestrator import userfiles
from orchestrator.adapters.known_hosts import load_known_hosts
from orchestrator.client.backends import AgentClient
from orchestrator.client.targets import Target
from orchestrator.errors import AgentError, OrchestratorError, TransportError

CONNECT_TIMEOUT = 10.0
RELAY_NOT_FOUND = 127


def open_ssh(target: Target, timeout: float = CONNECT_TIMEOUT) -> paramiko.SSHClient:
    """An authenticated SSH connection with a strictly checked host key; TransportError otherwise."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    known = target.known_hosts
    try:
        load_known_hosts(client, known)
        if target.key is not None:
            userfiles.check_regular(target.key)
    except OSError as exc:
        what = f"SSH key {target.key}" if target.key and exc.filename == target.key \
            else f"known_hosts {known or '~/.ssh/known_hosts'}"
        raise TransportError(f"host {target.name}: cannot read {what}: {exc.strerror}") from exc
    own_key = target.key is not None
    try:
        client.connect(target.address, port=target.port, username=target.user, key_filename=target.key,
                       look_for_keys=not own_key, allow_agent=not own_key, timeout=timeout,
                       banner_timeout=timeout, auth_timeout=timeout)
    except paramiko.BadHostKeyException as exc:
        raise TransportError(f"host {target.name} ({target.where}): host key mismatch: the server offered "
                             f"{exc.key.get_name()} {exc.key.fingerprint}, {known or '~/.ssh/known_hosts'} "
                             f"expects {exc.expected_key.fingerprint}") from exc
    except paramiko.AuthenticationException as exc:
        raise TransportError(f"host {target.name} ({target.where}): authentication failed ({exc})") from exc
    except paramiko.ssh_exception.NoValidConnectionsError as exc:
        raise TransportError(f"host {target.name} ({target.where}): SSH connection refused") from exc
    except paramiko.SSHException as exc:  # RejectPolicy: "Server ... not found in known_hosts"
        raise TransportError(f"host {target.name} ({target.where}): SSH failed: {exc}") from exc
    except TimeoutError as exc:
        raise TransportError(f"host {target.name} ({target.where}): SSH connection timed out "
                             f"after {timeout:g} s") from exc
    except OSError as exc:
        raise TransportError(f"host {target.name} ({target.where}): SSH connection failed: "
                             f"{exc.strerror or exc}") from exc
    transport = client.get_transport()
    if transport is not None:
        transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # many small lines
        transport.set_keepalive(15)
    return client


class RemoteAgentClient(AgentClient):
    """AgentClient whose stream is a relay channel on one SSH connection to the box."""

    def __init__(self, target: Target) -> None:
        super().__init__(f"{target.name}:{target.socket or 'agent.sock'}")
        self.target = target
        self.follow_hint = f"--host {shlex.quote(target.name)} "
        self._ssh: paramiko.SSHClient | None = None

    def _transport(self) -> paramiko.Transport:
        if self._ssh is None:
            self._ssh = open_ssh(self.target)
        transport = self._ssh.get_transport()
        if transport is None or not transport.is_active():
            raise TransportError(f"host {self.target.name} ({self.target.where}): the SSH connection closed")
        return transport

    def _open(self) -> Any:
        try:
            channel = self._transport().open_session(timeout=CONNECT_TIMEOUT)
            channel.exec_command(self.target.relay_command())
        except paramiko.SSHException as exc:
            raise TransportError(f"host {self.target.name} ({self.target.where}): could not start the relay: "
                                 f"{exc}") from exc
        return channel

    def _closed_early(self, op: str, stream: Any) -> OrchestratorError:
        channel: paramiko.Channel = stream
        transport = self._ssh.get_transport() if self._ssh else None
        if transport is None or not transport.is_active():
            return TransportError(f"host {self.target.name} ({self.target.where}): the SSH connection dropped "
                                  f"during {op}; the agent on the box carries on (re-attach with `orchestrator "
                                  f"{self.follow_hint}status --follow`)")
        status = channel.recv_exit_status()
        err = channel.makefile_stderr("rb").read().decode(errors="replace").strip()
        if status == 0 and not err:  # the relay saw the agent's socket close: the agent went away
            return AgentError(self.went_away(op))
        last = err.splitlines()[-1].removeprefix("error: ") if err else f"relay exited {status}"
        if status == RELAY_NOT_FOUND:
            return AgentError(f"host {self.target.name}: no orchestrator on the box ({last}); install it with "
                              f"`orchestrator agent install ssh://{self.target.where}` or set python in the "
                              "hosts file")
        return AgentError(f"host {self.target.name}: {last}")

    def open_relay(self, socket_path: str) -> paramiko.Channel:
        """A byte stream to another Unix socket of the agent on the box (the dashboard's), through the
        same relay on the same SSH connection: the agent sees the SSH login's uid, as on its socket."""
        try:
            channel = self._transport().open_session(timeout=CONNECT_TIMEOUT)
            channel.exec_command(shlex.join([self.target.python, "-m", "orchestrator.agent.relay",
                                             "--socket", socket_path]))
        except paramiko.SSHException as exc:
            raise TransportError(f"host {self.target.name} ({self.target.where}): could not start the relay: "
                                 f"{exc}") from exc
        return channel

    def close(self) -> None:
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None
