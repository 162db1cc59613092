"""The Systemd port for a machine with no systemd (the GPU machine): a unit is a process session.

``start`` runs the ExecStart= of the unit text the product rendered, with its Environment= lines,
in a new session (setsid), stdout and stderr to a log file, creating StateDirectory=/CacheDirectory=
as systemd would. The session stands in for the unit's cgroup: every process the engine spawns
inherits it, also after its parent died (an orphan is reparented, its session stays), so
``cgroup_pids`` finds the leftovers the product's freeing step must reap. ``stop`` does what
KillMode=control-group does: SIGTERM to every process of the session, SIGKILL after TimeoutStopSec.
Limits: a process that calls setsid() itself escapes (vLLM does not); User=/Group= are ignored.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.observed import UnitState
from orchestrator.errors import SystemdError


def _unquote(value: str) -> list[str]:
    """Words of an ExecStart=/Environment= value as the product quotes them (core/render.py)."""
    return [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]


def parse_unit(text: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """(argv, environment, other [Service] keys) of a rendered unit."""
    argv: list[str] = []
    env: dict[str, str] = {}
    keys: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#"):
            continue
        if key == "ExecStart":
            argv = _unquote(value)
        elif key == "Environment":
            for word in _unquote(value):
                k, _, v = word.partition("=")
                env[k] = v
        else:
            keys[key] = value
    if not argv:
        raise SystemdError("unit has no ExecStart= line")
    return argv, env, keys


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes whose session id is ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:  # state, ppid, pgrp, session
            pids.append(int(entry))
    return sorted(pids)


def describe(pid: int) -> str:
    """'pid comm (cmdline)' for logs: what ps would show."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"{pid} (gone)"
    return f"{pid} {comm} ({cmd[:120]})"


@dataclass
class _Unit:
    text: str
    proc: subprocess.Popen[bytes] | None = None
    sid: int = 0
    log: Path | None = None
    stopping: bool = False
    failed: bool = False
    started_at: float = 0.0
    exits: dict[int, float] = field(default_factory=dict)


class ProcessUnits:
    """Implements the product's Systemd protocol (ports.py) with processes; see the module docstring."""

    def __init__(self, host: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.host = host
        self.log_dir = log_dir
        self.extra_env = env or {}
        self.units: dict[str, _Unit] = {}

    # ---- files ---------------------------------------------------------------------------------
    def install_unit(self, unit: str, content: str) -> None:
        self.units.setdefault(unit, _Unit(content)).text = content

    def read_unit(self, unit: str) -> str | None:
        u = self.units.get(unit)
        return u.text if u else None

    def remove_unit(self, unit: str) -> None:
        self.units.pop(unit, None)

    def daemon_reload(self) -> None:
        return None

    def enable(self, unit: str) -> None:
        return None

    def disable(self, unit: str) -> None:
        return None

    # ---- jobs ----------------------------------------------------------------------------------
    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        u = self._unit(unit)
        if u.proc is not None and u.proc.poll() is None:
            return
        argv, env, keys = parse_unit(u.text)
        for key, base in (("StateDirectory", "/var/lib"), ("CacheDirectory", "/var/cache")):
            if keys.get(key):
                os.makedirs(f"{base}/{keys[key]}", exist_ok=True)
        u.log = self.log_dir / f"{unit}.log"
        with open(u.log, "ab") as log:
            u.proc = subprocess.Popen(
                argv,
                env={**os.environ, **env, **self.extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        u.sid, u.stopping, u.failed, u.started_at, u.exits = u.proc.pid, False, False, time.monotonic(), {}

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        u = self.units.get(unit)
        if u is None or u.proc is None:
            return
        keys = parse_unit(u.text)[2]
        grace = float(re.sub(r"[^\d.]", "", keys.get("TimeoutStopSec", "90")) or 90)
        u.stopping = True
        watch = set(session_pids(u.sid))
        self.kill_unit(unit, signal.SIGTERM)
        start = time.monotonic()
        while time.monotonic() - start < grace:
            u.proc.poll()  # reap the main process, or it stays a zombie
            left = set(session_pids(u.sid))
            for pid in watch - left:
                u.exits.setdefault(pid, round(time.monotonic() - start, 3))  # seconds after SIGTERM
            if not left:
                return
            time.sleep(0.05)
        self.kill_unit(unit, signal.SIGKILL)

    def restart(self, unit: str, *, timeout: float = 90.0) -> None:
        self.stop(unit)
        self.start(unit, timeout=timeout)

    def reset_failed(self, unit: str) -> None:
        if unit in self.units:
            self.units[unit].failed = False

    def kill_unit(self, unit: str, signal: int) -> None:
        u = self.units.get(unit)
        for pid in session_pids(u.sid) if u and u.sid else []:
            try:
                os.kill(pid, signal)
            except ProcessLookupError:
                pass

    # ---- views ---------------------------------------------------------------------------------
    def unit_state(self, unit: str) -> UnitState:
        u = self.units.get(unit)
        if u is None:
            return UnitState(name=unit, load_state="not-found", active_state="inactive", sub_state="dead")
        if u.proc is None:
            return UnitState(name=unit, load_state="loaded", active_state="inactive", sub_state="dead")
        code = u.proc.poll()
        if code is None:
            return UnitState(
                name=unit, load_state="loaded", active_state="active", sub_state="running", main_pid=u.proc.pid
            )
        if code != 0 and not u.stopping:
            u.failed = True
        if u.failed:
            return UnitState(
                name=unit,
                load_state="loaded",
                active_state="failed",
                sub_state="failed",
                exec_main_status=code,
                result="exit-code" if code > 0 else "signal",
            )
        return UnitState(
            name=unit, load_state="loaded", active_state="inactive", sub_state="dead", exec_main_status=code
        )

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]:
        u = self.units.get(unit)
        if u is None or u.log is None or not u.log.exists():
            return []
        return u.log.read_text(errors="replace").splitlines()[-lines:]

    def cgroup_pids(self, unit: str) -> list[int]:
        u = self.units.get(unit)
        return session_pids(u.sid) if u and u.sid else []

    def main_pid(self, unit: str) -> int:
        u = self._unit(unit)
        return u.proc.pid if u.proc is not None else 0

    def _unit(self, unit: str) -> _Unit:
        if unit not in self.units:
            raise SystemdError(f"{unit}: not installed", host=self.host, unit=unit)
        return self.units[unit]
