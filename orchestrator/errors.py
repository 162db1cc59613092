"""One error hierarchy for the whole tool.

Every error names what it is about (a file and key, a host, a unit, a step) and the bad value,
and carries the process exit code the CLI uses. Adapters map library errors into these at the
boundary with ``raise ... from exc`` so nothing above them sees paramiko, httpx or GLib types.
"""

from __future__ import annotations

from orchestrator.secrets import redact


class OrchestratorError(Exception):
    """Root of every error the tool raises on purpose."""

    exit_code = 1
    # What a command had done before it failed (`switch A B --json`), printed with its JSON error.
    partial: object = None

    def __init__(
        self, message: str, *, host: str | None = None, unit: str | None = None, step: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.host = host
        self.unit = unit
        self.step = step

    def __str__(self) -> str:
        prefix = f"host {self.host}: " if self.host and not self.message.startswith("host ") else ""
        return prefix + self.message


class ConfigError(OrchestratorError):
    """deploy.toml or the environment is invalid: names the file, the key path and the value."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        where = ": ".join(p for p in (file, key) if p)
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.key = key


class UsageError(OrchestratorError):
    """A command was called with arguments that cannot work (unknown model, bad flag value)."""

    exit_code = 2


class RenderError(OrchestratorError):
    """A value cannot be written into a unit file safely."""

    exit_code = 2


class AccessDenied(OrchestratorError):
    """The unit's user cannot reach its engine or its weights: the unit would die (203/EXEC) after the
    serving model was stopped, so a switch refuses before anything stops."""

    exit_code = 2


class AdoptError(OrchestratorError):
    """An engine found on a box cannot be adopted as it runs (`orchestrator adopt`): names the unit or
    pid and the value that cannot be expressed in deploy.toml."""

    exit_code = 2


class PlanError(OrchestratorError):
    """The requested layout cannot load on the host; the message carries the fix."""

    exit_code = 3


class TransportError(OrchestratorError):
    """The host could not be reached or the connection broke (SSH refused, auth, host key)."""

    exit_code = 4


class RolloutPaused(TransportError):
    """A rollout cannot go on: a box it switched (or must see) is unreachable; its agent carries on.
    A controller's agent retries until the box answers; an in-CLI rollout ends, `rollout resume` goes on."""

    def __init__(self, message: str, *, rollout: int, lost: list[str]) -> None:
        super().__init__(message)
        self.rollout, self.lost = rollout, lost


class GpuProbeError(OrchestratorError):
    """The GPUs could not be read: nvidia-smi could not be run or answered an error, or NVML failed
    (no driver, no library, a GPU lost); names the host and the tool's own error."""


class CommandFailed(OrchestratorError):
    """A command on a host exited non-zero: names the command, the exit code and its last output."""

    def __init__(self, command: str, exit_code: int, output: str, *, host: str | None = None) -> None:
        output = redact(output)
        tail = "\n".join(output.strip().splitlines()[-10:])
        # The shells name inline scripts (core.commands); a long line from elsewhere is cut, not carried whole.
        named = command if len(command) <= 400 else f"{command[:200]}... ({len(command):,} characters)"
        super().__init__(f"command {named!r} exited {exit_code}" + (f":\n{tail}" if tail else ""), host=host)
        self.command = command
        self.returncode = exit_code
        self.output = output


class SystemdError(OrchestratorError):
    """systemd refused an operation or a unit ended up in a state we did not ask for."""


class UnitNotFound(SystemdError):
    """The unit is not known to systemd on that host."""


class GpuBusy(OrchestratorError):
    """GPU memory is still held after the grace period; names PIDs, process names and memory."""


class ProxyError(OrchestratorError):
    """The front proxy could not take a config: invalid, its port taken, or its unit failed."""


class HealthCheckFailed(OrchestratorError):
    """The server never proved it can serve: /health, /v1/models or a real completion failed."""


class SmokeGateFailed(HealthCheckFailed):
    """The new revision serves, but slower than the policy allows; carries the benchmark record."""

    def __init__(self, message: str, *, host: str, unit: str, bench: dict[str, object]) -> None:
        super().__init__(message, host=host, unit=unit)
        self.bench = bench


class EngineError(OrchestratorError):
    """The engine answered a control call (sleep, wake, is_sleeping) with an error, or not at all;
    carries its own words: the HTTP status (None: no answer) and the body."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        host: str | None = None,
        unit: str | None = None,
    ) -> None:
        super().__init__(message, host=host, unit=unit)
        self.status = status
        self.body = body


class EngineWedged(EngineError):
    """A woken engine cannot serve: its wake failed or its first completion did not answer in time.
    Only a restart frees it (a half-woken engine keeps memory and hangs every request)."""


class Abandoned(OrchestratorError):
    """A cold start on demand that nobody waits for any more: every held request was cancelled. The
    switch fails on purpose and rolls back (the engine stopped, its GPUs verified free)."""


class SleepLeftMemory(GpuBusy):
    """An engine answered its sleep with 200 but kept more GPU memory than a sleeper's residue."""


class WeightsError(OrchestratorError):
    """Weights could not be staged or failed verification (missing shard, wrong size, no space)."""


class StateError(OrchestratorError):
    """The state store or the state machine refused an operation (illegal transition, busy host)."""


class StateStoreError(StateError):
    """The state database cannot be used as it is (not a database, a newer schema, foreign tables):
    the operator has to act on the file, so it is bad input, not a failed operation."""

    exit_code = 2


class Busy(StateError):
    """Another operation already runs on this host; names it."""

    exit_code = 5


class Refused(OrchestratorError):
    """The caller may not do this (a socket-group member changing what only root may change)."""

    exit_code = 5


class NodeInUse(Busy):
    """A single-box switch needs GPUs where a rank of a multi-node model headed on another host runs."""


class AgentError(OrchestratorError):
    """The agent could not be reached or refused the request."""

    exit_code = 6


class Detached(OrchestratorError):
    """The CLI stopped watching (Ctrl-C, lost terminal); the agent carries on with the operation."""

    exit_code = 130


class Interrupted(OrchestratorError):
    """Ctrl-C stopped an operation that ran in this process (no agent): its step finished or parked and
    is recorded; `recover` (or the next switch, or the agent's start) finishes the deployment."""

    exit_code = 130
