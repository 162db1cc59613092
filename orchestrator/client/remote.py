"""The CLI as a client of a box's agent over SSH: one connection, a relay channel per request.

Each request opens a channel on the one SSH connection and runs the relay there
(``python -m orchestrator.agent.relay``), which pipes it to the agent's Unix socket; the JSON
lines are the same as on the box. Host keys are checked against known_hosts and never added
(adapters/ssh_session.py makes the connection).
"""

from __future__ import annotations

import shlex
from typing import Any

from orchestrator.adapters.ssh_session import SshSession
from orchestrator.client.backends import AgentClient, Stream
from orchestrator.client.targets import Target
from orchestrator.errors import AgentError, OrchestratorError, TransportError

RELAY_NOT_FOUND = 127


class RemoteAgentClient(AgentClient):
    """AgentClient whose stream is a relay channel on one SSH connection to the box."""

    def __init__(self, target: Target) -> None:
        super().__init__(f"{target.name}:{target.socket or 'agent.sock'}")
        self.target = target
        self.follow_hint = f"--host {shlex.quote(target.name)} "
        self._ssh: SshSession | None = None

    def _session(self) -> SshSession:
        if self._ssh is None:
            self._ssh = SshSession(self.target)
        return self._ssh

    def open_stream(self) -> Stream:
        channel: Stream = self._session().exec(self.target.relay_command(), "the relay")
        return channel

    def ended(self, op: str, stream: Any) -> OrchestratorError:
        if self._ssh is None or not self._ssh.active():
            return TransportError(
                f"host {self.target.name} ({self.target.where}): the SSH connection dropped "
                f"during {op}; the agent on the box carries on (re-attach with `orchestrator "
                f"{self.follow_hint}status --follow`)"
            )
        status = stream.recv_exit_status()
        err = stream.makefile_stderr("rb").read().decode(errors="replace").strip()
        if status == 0 and not err:  # the relay saw the agent's socket close: the agent went away
            return AgentError(self.went_away(op))
        last = err.splitlines()[-1].removeprefix("error: ") if err else f"relay exited {status}"
        if status == RELAY_NOT_FOUND:
            return AgentError(
                f"host {self.target.name}: no orchestrator on the box ({last}); install it with "
                f"`orchestrator agent install ssh://{self.target.where}` or set python in the "
                "hosts file"
            )
        return AgentError(f"host {self.target.name}: {last}")

    def open_relay(self, socket_path: str) -> Any:
        """A byte stream to another Unix socket of the agent on the box (the dashboard's), through the
        same relay on the same SSH connection: the agent sees the SSH login's uid, as on its socket."""
        return self._session().exec(
            shlex.join([self.target.python, "-m", "orchestrator.agent.relay", "--socket", socket_path]), "the relay"
        )

    def close(self) -> None:
        if self._ssh is not None:
            self._ssh.close()
            self._ssh = None
