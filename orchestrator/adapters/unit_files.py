"""What both systemd adapters do through the host's Shell: unit files, journal, cgroup members.

D-Bus has no call for writing unit files or reading the journal, so the D-Bus adapter uses the
local Shell for these and the SSH adapter the remote one: the same code, the same behaviour.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from orchestrator.core.observed import UnitState
from orchestrator.errors import SystemdError, UsageError
from orchestrator.ports import Shell
from orchestrator.secrets import redact

DEFAULT_UNIT_DIR = "/etc/systemd/system"
UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "MainPID",
    "ExecMainStatus",
    "NRestarts",
    "Result",
    "ControlGroup",
    "FragmentPath",
    "ExecMainStartTimestamp",
)
# ``systemctl show`` prints timestamps for people; run with TZ=UTC (the SSH adapter does) they end
# in UTC. (``--timestamp=unix`` needs systemd 251: Ubuntu 22.04 has 249.)
_SHOWN_UTC = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)? UTC$")
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.(service|socket|timer|target|path|mount|slice|scope)$")


def check_unit_name(unit: str) -> str:
    """Unit names become file paths and command arguments: refuse anything that is not one."""
    if not _UNIT_NAME.fullmatch(unit) or unit.startswith((".", "-")):
        raise UsageError(f"unit name {unit!r} is not a valid systemd unit name", unit=unit)
    return unit


def cgroup_roots(cgroup: str) -> list[str]:
    """Where a unit's ``cgroup`` (its ControlGroup) lies: cgroup v2's tree, then a hybrid host's
    (v1 + v2) unified and systemd trees; only those that exist hold it."""
    return [f"/sys/fs/cgroup{sub}{cgroup}" for sub in ("", "/unified", "/systemd")]


def state_from_properties(unit: str, props: dict[str, str]) -> UnitState:
    """UnitState from systemd property values as text (``systemctl show`` or D-Bus, stringified)."""

    def num(key: str) -> int:
        try:
            return int(props.get(key) or 0)
        except ValueError:
            return 0  # "[not set]" and friends on units that are not services

    return UnitState(
        name=unit,
        load_state=props.get("LoadState", ""),
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        main_pid=num("MainPID"),
        exec_main_status=num("ExecMainStatus"),
        n_restarts=num("NRestarts"),
        result=props.get("Result") or "success",
        control_group=props.get("ControlGroup", ""),
        fragment_path=props.get("FragmentPath", ""),
        started_at=timestamp(props.get("ExecMainStartTimestamp", "")),
    )


def timestamp(value: str) -> float | None:
    """A systemd timestamp as epoch seconds: D-Bus gives microseconds, ``systemctl show`` (in UTC)
    a date; 0, empty and "n/a" are "never"."""
    value = value.strip()
    if value.isdigit():
        return int(value) / 1e6 if int(value) else None
    shown = _SHOWN_UTC.search(value)
    if shown is None:
        return None
    at = datetime.strptime(shown.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return at + float(shown.group(2) or 0)


class ShellUnitFiles:
    """Unit files, journal and cgroup PIDs of one host, through its Shell."""

    host: str

    def __init__(self, shell: Shell, unit_dir: str = DEFAULT_UNIT_DIR) -> None:
        self.shell = shell
        self.unit_dir = unit_dir.rstrip("/") or "/"
        self.host = shell.host

    def unit_state(self, unit: str) -> UnitState:
        raise NotImplementedError

    def _path(self, unit: str) -> str:
        return f"{self.unit_dir}/{check_unit_name(unit)}"

    def install_unit(self, unit: str, content: str) -> None:
        self.shell.write_file(self._path(unit), content.encode(), 0o644)

    def read_unit(self, unit: str) -> str | None:
        data = self.shell.read_file(self._path(unit))
        return None if data is None else data.decode()

    def remove_unit(self, unit: str) -> None:
        self.shell.run(["rm", "-f", "--", self._path(unit)], idempotent=True)

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]:
        # journald reads a unit's output from a stream socket and may index it after the job's result
        # (or the unit's death) reached us: `journalctl --sync` is processed after every message queued
        # before it, a barrier that makes the lines a failed start printed visible (one round trip).
        script = 'journalctl --sync >/dev/null 2>&1; exec journalctl -u "$1" -n "$2" --no-pager -q -o cat'
        res = self.shell.run(
            ["sh", "-c", script, "journal_tail", check_unit_name(unit), str(int(lines))], idempotent=True, check=False
        )
        if not res.ok:
            raise SystemdError(
                f"journalctl for {unit} exited {res.exit_code}: {res.stderr.strip()}", host=self.host, unit=unit
            )
        return [redact(line) for line in res.stdout.splitlines()]  # journal text: secrets hidden at the source

    def cgroup_pids(self, unit: str) -> list[int]:
        cgroup = self.unit_state(unit).control_group
        if not cgroup:
            return []
        # Missing roots and a cgroup vanishing mid-read make find fail: what it printed still holds.
        # Units may own sub-cgroups (Delegate=, workers): read every level.
        res = self.shell.run(
            ["find", *cgroup_roots(cgroup), "-name", "cgroup.procs", "-exec", "cat", "--", "{}", "+"],
            idempotent=True,
            check=False,
        )
        return sorted({int(p) for p in res.stdout.split() if p.isdigit()})
