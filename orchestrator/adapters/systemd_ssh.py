"""Systemd over SSH: ``systemctl``/``journalctl`` through one SshShell, every argument quoted.

``systemctl start/stop/restart`` wait for their job by default; --job-mode=replace makes a new
request win over a queued one, as the D-Bus adapter's "replace" mode does.
"""

from __future__ import annotations

import signal as signals

from orchestrator.adapters.unit_files import (
    DEFAULT_UNIT_DIR,
    UNIT_PROPERTIES,
    ShellUnitFiles,
    check_unit_name,
    state_from_properties,
)
from orchestrator.core.observed import CommandResult, UnitState
from orchestrator.errors import CommandFailed, SystemdError, UnitNotFound
from orchestrator.ports import Shell
from orchestrator.secrets import redact


class SshSystemd(ShellUnitFiles):
    """The systemd manager of a host reached through a Shell (normally SshShell)."""

    def __init__(self, shell: Shell, unit_dir: str = DEFAULT_UNIT_DIR) -> None:
        super().__init__(shell, unit_dir)

    def _systemctl(
        self,
        *args: str,
        timeout: float | None = None,
        idempotent: bool = True,
    ) -> CommandResult:
        return self.shell.run(["systemctl", *args], timeout=timeout, check=False, idempotent=idempotent)

    def unit_state(self, unit: str) -> UnitState:
        # TZ=UTC: its timestamps come out in UTC, whatever the host's zone (unit_files.timestamp)
        res = self.shell.run(
            [
                "env",
                "TZ=UTC",
                "systemctl",
                "show",
                "--property=" + ",".join(UNIT_PROPERTIES),
                "--",
                check_unit_name(unit),
            ],
            check=False,
        )
        if not res.ok:
            raise SystemdError(
                f"systemctl show {unit} exited {res.exit_code}: {res.stderr.strip()}", host=self.host, unit=unit
            )
        props = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        return state_from_properties(unit, props)

    def _job(self, verb: str, unit: str, timeout: float, idempotent: bool) -> None:
        try:
            res = self._systemctl(
                verb, "--job-mode=replace", "--", check_unit_name(unit), timeout=timeout, idempotent=idempotent
            )
        except CommandFailed as exc:
            if exc.returncode == 124:
                raise SystemdError(
                    f"{verb} of {unit} did not finish within {timeout:g} s", host=self.host, unit=unit
                ) from exc
            raise
        if res.ok:
            return
        state = self.unit_state(unit)
        if not state.exists:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        tail = "\n".join(self.journal_tail(unit, 10))
        raise SystemdError(
            f"{verb} of {unit} failed (ActiveState={state.active_state}, "
            f"Result={state.result}): {redact(res.stderr.strip())}" + (f"\n{tail}" if tail else ""),
            host=self.host,
            unit=unit,
        )

    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        self._job("start", unit, timeout, idempotent=True)

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        if not self.unit_state(unit).exists:
            return
        self._job("stop", unit, timeout, idempotent=True)

    def restart(self, unit: str, *, timeout: float = 90.0) -> None:
        self._job("restart", unit, timeout, idempotent=False)

    def reset_failed(self, unit: str) -> None:
        if self.unit_state(unit).exists:
            self._checked("reset-failed", "--", unit)

    def daemon_reload(self) -> None:
        self._checked("daemon-reload")

    def enable(self, unit: str, *, reload: bool = True) -> bool:
        return self._unit_file_op("enable", unit, reload)

    def disable(self, unit: str, *, reload: bool = True) -> bool:
        return self._unit_file_op("disable", unit, reload)

    def _unit_file_op(self, verb: str, unit: str, reload: bool) -> bool:
        # systemctl reports each link it created or removed on stderr and prints nothing when there
        # was nothing to do; anything else it says (a warning) counts as a change: one reload too many.
        res = self._systemctl(verb, *([] if reload else ["--no-reload"]), "--", check_unit_name(unit))
        if res.ok:
            return bool(res.stderr.strip())
        if "does not exist" in res.stderr or not self.unit_state(unit).exists:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        raise SystemdError(
            f"systemctl {verb} {unit} exited {res.exit_code}: {res.stderr.strip()}", host=self.host, unit=unit
        )

    def kill_unit(self, unit: str, signal: int) -> None:
        state = self.unit_state(unit)
        if not state.exists:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        if state.control_group:  # no cgroup: no process left to signal
            self._checked("kill", "--kill-whom=all", f"--signal={signals.Signals(signal).name}", "--", unit)

    def _checked(self, *args: str) -> None:
        res = self._systemctl(*args)
        if not res.ok:
            raise SystemdError(
                f"systemctl {' '.join(args)} exited {res.exit_code}: {res.stderr.strip()}", host=self.host
            )
