"""Systemd over D-Bus (pydbus): the local host's manager, org.freedesktop.systemd1.

Jobs are tracked through the Manager's JobRemoved signal: we subscribe before asking for the
job (so a fast job cannot finish unseen), then pump the GLib main context until our job's
signal arrives and check its result. Files and the journal go through the local Shell.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pydbus
from gi.repository import Gio, GLib

from orchestrator.adapters.unit_files import (
    DEFAULT_UNIT_DIR,
    UNIT_PROPERTIES,
    ShellUnitFiles,
    cgroup_roots,
    check_unit_name,
    state_from_properties,
)
from orchestrator.core.observed import UnitState
from orchestrator.errors import SystemdError, TransportError, UnitNotFound
from orchestrator.ports import Shell

_SYSTEMD = "org.freedesktop.systemd1"
_ALREADY_SUBSCRIBED = "org.freedesktop.systemd1.AlreadySubscribed"
_NOT_FOUND = (
    "org.freedesktop.systemd1.NoSuchUnit",
    "org.freedesktop.DBus.Error.FileNotFound",
    "org.freedesktop.systemd1.LoadFailed",
)


def unit_path(unit: str) -> str:
    """systemd's object path of ``unit`` (its bus_label_escape: every byte but an ASCII letter, or a digit
    after the first, as _XX). Asking that path loads the unit as LoadUnit would: one round trip less."""
    label = "".join(
        chr(b) if chr(b).isascii() and (chr(b).isalpha() or (i > 0 and chr(b).isdigit())) else f"_{b:02x}"
        for i, b in enumerate(unit.encode())
    )
    return f"/org/freedesktop/systemd1/unit/{label or '_'}"


def _dbus_name(exc: GLib.Error) -> str:
    return str(Gio.DBusError.get_remote_error(exc) or "")


class DbusSystemd(ShellUnitFiles):
    """The systemd manager of the machine we run on, over the system bus."""

    def __init__(self, shell: Shell, unit_dir: str = DEFAULT_UNIT_DIR) -> None:
        super().__init__(shell, unit_dir)
        try:
            # pydbus hands every caller in this process the one shared system-bus connection, and
            # systemd's subscription belongs to that connection: a second adapter finds it taken
            # (AlreadySubscribed), which is what it wanted. No adapter ever Unsubscribe()s, since
            # that would silence JobRemoved for every other adapter on the connection.
            self._bus = pydbus.SystemBus()
            self._manager = self._bus.get(_SYSTEMD, "/org/freedesktop/systemd1")
            self._subscribe()
        except GLib.Error as exc:
            raise TransportError(f"cannot reach systemd on the system bus: {exc.message}", host=self.host) from exc
        self._finished: dict[str, str] = {}
        self._ctx = GLib.MainContext.default()
        self._subscription = self._manager.JobRemoved.connect(self._on_job_removed)

    def _subscribe(self) -> None:
        """JobRemoved is only sent to subscribed clients."""
        try:
            self._manager.Subscribe()
        except GLib.Error as exc:
            if _dbus_name(exc) != _ALREADY_SUBSCRIBED:
                raise

    def _on_job_removed(self, job_id: int, job: str, unit: str, result: str) -> None:
        self._finished[job] = result

    def _error(self, exc: GLib.Error, unit: str | None, what: str) -> Exception:
        name = _dbus_name(exc)
        if unit and name in _NOT_FOUND:
            return UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        return SystemdError(f"{what} failed: {name or 'D-Bus error'}: {exc.message}", host=self.host, unit=unit)

    def unit_state(self, unit: str) -> UnitState:
        check_unit_name(unit)
        path = unit_path(unit)
        try:
            values = self._properties(path, "Unit")
            if unit.endswith(".service") and values.get("LoadState") == "loaded":
                values.update(self._properties(path, "Service"))
        except GLib.Error as exc:
            raise self._error(exc, unit, f"reading {unit}") from exc
        return state_from_properties(unit, {k: values.get(k, "") for k in UNIT_PROPERTIES})

    def cgroup_pids(self, unit: str) -> list[int]:
        """As ShellUnitFiles reads them, from this machine's own cgroup tree (the bus is local): no
        process spawned for a read the warm window makes."""
        cgroup = self.unit_state(unit).control_group
        if not cgroup:
            return []
        pids: set[int] = set()
        for root in cgroup_roots(cgroup):
            # A missing root or a cgroup vanishing mid-walk yields nothing more: what was read holds.
            for directory, _dirs, files in os.walk(root):
                if "cgroup.procs" not in files:
                    continue
                try:
                    text = Path(directory, "cgroup.procs").read_text()
                except OSError:
                    continue
                pids.update(int(p) for p in text.split() if p.isdigit())
        return sorted(pids)

    def _properties(self, path: str, interface: str) -> dict[str, str]:
        """UNIT_PROPERTIES of one interface of a unit's object, from one GetAll (one consistent view).

        Called on the bus connection itself: a pydbus proxy of the object would introspect it first
        (systemd's XML of every interface, parsed into classes) on every call, and unpacking the whole
        reply would convert some 200 properties; the watch and every step read units often."""
        reply = self._bus.con.call_sync(
            _SYSTEMD,
            path,
            "org.freedesktop.DBus.Properties",
            "GetAll",
            GLib.Variant("(s)", (f"{_SYSTEMD}.{interface}",)),
            GLib.VariantType.new("(a{sv})"),
            Gio.DBusCallFlags.NONE,
            -1,
            None,
        )
        props = reply.get_child_value(0)
        found = {key: props.lookup_value(key, None) for key in UNIT_PROPERTIES}
        return {key: str(value.unpack()) for key, value in found.items() if value is not None}

    def _job(self, method: str, verb: str, unit: str, timeout: float) -> None:
        check_unit_name(unit)
        try:
            job = getattr(self._manager, method)(unit, "replace")
        except GLib.Error as exc:
            raise self._error(exc, unit, f"{verb} of {unit}") from exc
        deadline = time.monotonic() + timeout
        while job not in self._finished:
            if time.monotonic() > deadline:
                raise SystemdError(
                    f"{verb} of {unit} did not finish within {timeout:g} s ({job})", host=self.host, unit=unit
                )
            if not self._ctx.iteration(False):
                time.sleep(0.01)  # nothing pending: yield instead of spinning
        result = self._finished[job]
        # Callbacks run only inside this loop, after our job exists: whatever else was recorded
        # (other clients' jobs) can go, so a long-running agent does not accumulate them.
        self._finished.clear()
        if result != "done":
            state = self.unit_state(unit)
            tail = "\n".join(self.journal_tail(unit, 10))
            raise SystemdError(
                f"{verb} of {unit} ended with job result {result!r} "
                f"(ActiveState={state.active_state}, Result={state.result})" + (f"\n{tail}" if tail else ""),
                host=self.host,
                unit=unit,
            )

    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        self._job("StartUnit", "start", unit, timeout)

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        if not self.unit_state(unit).exists:
            return
        self._job("StopUnit", "stop", unit, timeout)

    def restart(self, unit: str, *, timeout: float = 90.0) -> None:
        self._job("RestartUnit", "restart", unit, timeout)

    def reset_failed(self, unit: str) -> None:
        if not self.unit_state(unit).exists:
            return
        self._call("ResetFailedUnit", unit, unit)

    def daemon_reload(self) -> None:
        self._call("Reload", None)

    def enable(self, unit: str, *, reload: bool = True) -> bool:
        reply = self._call("EnableUnitFiles", check_unit_name(unit), [unit], False, True)
        changes = reply[1] if isinstance(reply, tuple) else True  # (carries_install_info, changes)
        return self._reloaded(bool(changes), reload)

    def disable(self, unit: str, *, reload: bool = True) -> bool:
        changes = self._call("DisableUnitFiles", check_unit_name(unit), [unit], False)
        return self._reloaded(bool(changes), reload)

    def _reloaded(self, changed: bool, reload: bool) -> bool:
        # As `systemctl enable` does, but only when a link changed: a reload re-reads every unit.
        if changed and reload:
            self.daemon_reload()
        return changed

    def kill_unit(self, unit: str, signal: int) -> None:
        state = self.unit_state(unit)
        if not state.exists:
            raise UnitNotFound(f"unit {unit} not found", host=self.host, unit=unit)
        if state.control_group:  # no cgroup: no process left to signal
            self._call("KillUnit", unit, unit, "all", int(signal))

    def _call(self, method: str, unit: str | None, *args: object) -> object:
        try:
            return getattr(self._manager, method)(*args)
        except GLib.Error as exc:
            raise self._error(exc, unit, method + (f" {unit}" if unit else "")) from exc

    def close(self) -> None:
        self._subscription.disconnect()
