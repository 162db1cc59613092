"""`orchestrator adopt`'s probes and the adopted process's end: the engines a box runs outside the
product (hand-written units, processes started by hand), read through the host's ports (systemd for the
units' states, the shell for their files and /proc), mapped by core/adopt.py; and the stop of an adopted
process by the switch that replaces it (steps.stopping), which freeing then verifies on the GPUs."""

from __future__ import annotations

import base64
import signal
from collections.abc import Iterable, Sequence

from orchestrator.core import adopt as a
from orchestrator.core import adopt_found as u
from orchestrator.core.records import UnitSpec
from orchestrator.deploy.context import StepContext
from orchestrator.engines import ENGINES, engine_running
from orchestrator.errors import AdoptError, GpuBusy
from orchestrator.ports import HostPorts, Shell

RENDERED_MARK = "# Rendered by orchestrator"
# Each process that looks like an engine's (its command line holds an engine's marker word): its pid and
# owner, then its cmdline, environ and cgroup (base64: NULs, newlines).
MARKERS = tuple(sorted({e.command_line.marker for e in ENGINES.values()}))
_SCAN = r"""for d in /proc/[0-9]*; do
  c=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null) || continue
  case "$c" in MARKERS) ;; *) continue ;; esac
  printf 'P %s %s\n' "${d#/proc/}" "$(stat -c %U "$d" 2>/dev/null || echo '?')"
  printf 'C %s\n' "$(base64 -w0 < "$d/cmdline" 2>/dev/null)"
  printf 'E %s\n' "$(base64 -w0 < "$d/environ" 2>/dev/null)"
  printf 'G %s\n' "$(base64 -w0 < "$d/cgroup" 2>/dev/null)"
done; true""".replace("MARKERS", "|".join(f"*{m}*" for m in MARKERS))


def discover(ports: HostPorts, units: Sequence[str], pids: Sequence[int], ours: Iterable[str]) -> list[a.Found]:
    """The engines running on the box: the units and processes named (each must run an engine's API server
    now), or with none named every active service whose command does and every such process outside
    systemd. ``ours``: units the product already manages (skipped)."""
    skip = set(ours)
    if units or pids:
        found = []
        for unit in units:
            state = ports.systemd.unit_state(unit)
            if not state.is_active:
                raise AdoptError(
                    f"unit {unit} is {state.active_state} ({state.load_state}): adopt records what "
                    "runs now; start it, or name a running one",
                    host=ports.host.name,
                )
            engine = _unit(ports.shell, unit)
            if engine is None:
                forms = "; ".join(f"{e.title}: {e.command_line.forms}" for e in ENGINES.values())
                raise AdoptError(
                    f"unit {unit}: its ExecStart does not run an engine's API server ({forms})",
                    host=ports.host.name,
                )
            found.append(engine)
        running = {f.pid: f for f in processes(ports.shell, set(_engine_units(ports.shell)) | skip)}
        for pid in pids:
            if pid not in running:
                raise AdoptError(
                    f"pid {pid}: no engine's API server runs outside systemd with that pid", host=ports.host.name
                )
            found.append(running[pid])
        return found
    found = []
    services = _engine_units(ports.shell)
    for unit in services:
        if unit in skip or unit.startswith("orchestrator-"):
            continue
        engine = _unit(ports.shell, unit)
        if engine is not None and not engine.unit_text.startswith(RENDERED_MARK):
            found.append(engine)
    return found + processes(ports.shell, set(services) | skip)


def _engine_units(shell: Shell) -> list[str]:
    """Active services whose ExecStart holds an engine's marker word (one systemctl call for all of them)."""
    listed = shell.run(
        ["systemctl", "list-units", "--type=service", "--state=active", "--plain", "--no-legend", "--no-pager"],
        check=False,
        idempotent=True,
    )
    names = [line.split()[0] for line in listed.stdout.splitlines() if line.split()]
    if not names:
        return []
    shown = shell.run(["systemctl", "show", "-p", "Id", "-p", "ExecStart", "--", *names], check=False, idempotent=True)
    out = []
    for block in shown.stdout.split("\n\n"):  # one per unit, its properties in systemd's order (not -p's)
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if any(m in props.get("ExecStart", "") for m in MARKERS) and props.get("Id"):
            out.append(props["Id"])
    return out


def _unit(shell: Shell, unit: str) -> a.Found | None:
    """A unit's engine, from its file and drop-ins as systemd reads them; None: no engine's API server."""
    shown = shell.run(
        ["systemctl", "show", "-p", "FragmentPath", "-p", "DropInPaths", "--", unit], check=False, idempotent=True
    )
    props = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    fragment = props.get("FragmentPath", "")
    raw = shell.read_file(fragment) if fragment else None
    if raw is None:
        raise AdoptError(
            f"unit {unit}: its file {fragment or '(none: a transient or generated unit)'} cannot be "
            "read: adopt keeps a unit's own file to roll back to",
            host=None,
        )
    text = raw.decode(errors="replace")
    drop_ins = props.get("DropInPaths", "").split()
    whole = text + "".join("\n" + (shell.read_file(p) or b"").decode(errors="replace") for p in drop_ins)
    fields = u.parse_unit(whole, unit)
    if engine_running(fields.argv) is None:
        return None
    unexpressed = fields.unexpressed + tuple(
        f"drop-in {p} stays on the box; the revision keeps {fragment} only" for p in drop_ins
    )
    return a.Found(
        argv=fields.argv,
        env=fields.env,
        user=fields.user,
        environment_files=fields.environment_files,
        unit=unit,
        unit_text=text,
        unexpressed=unexpressed,
    )


def processes(shell: Shell, units: set[str]) -> list[a.Found]:
    """Engines' API servers that no engine unit (of ``units``) runs: started from a shell, with setsid or not,
    whether in a login's scope or, without pam_systemd, in ssh.service's cgroup; a forked child with its
    parent's command line is its parent's."""
    result = shell.run(["sh", "-c", _SCAN], check=False, idempotent=True, timeout=60)
    rows: list[dict[str, str]] = []
    for line in result.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "P":
            number, _, owner = rest.partition(" ")
            rows.append({"pid": number, "user": owner})
        elif rows and tag in ("C", "E", "G"):
            rows[-1][tag] = rest
    found: dict[int, tuple[a.Found, int]] = {}
    for row in rows:
        argv = tuple(w for w in _b64(row.get("C", "")).split("\0") if w)
        engine = engine_running(argv)
        if not row["pid"].isdigit() or engine is None or u.in_system_unit(_b64(row.get("G", ""))) in units:
            continue
        pid = int(row["pid"])
        stat = u.proc_stat(pid, shell.read_file(f"/proc/{pid}/stat"))
        if stat is None:
            continue  # gone since
        environ = dict(w.split("=", 1) for w in _b64(row.get("E", "")).split("\0") if "=" in w)
        user = row.get("user") if row.get("user") not in (None, "?") else None
        found[pid] = (
            a.Found(argv=argv, env=u.engine_env(environ, engine), user=user, pid=pid, pid_start=stat.start),
            stat.ppid,
        )
    return [f for pid, (f, ppid) in sorted(found.items()) if ppid not in found]


def _b64(text: str) -> str:
    try:
        return base64.b64decode(text).decode(errors="replace")
    except ValueError:
        return ""


def started(shell: Shell, pid: int) -> int | None:
    """The process's start time (None: no such process)."""
    stat = u.proc_stat(pid, shell.read_file(f"/proc/{pid}/stat"))
    return None if stat is None else stat.start


def alive(shell: Shell, spec: UnitSpec) -> bool:
    """Whether the adopted process of ``spec`` still runs (the same one: its start time matches)."""
    return spec.pid is not None and started(shell, spec.pid) == spec.pid_start


def stop_processes(ctx: StepContext, specs: Iterable[UnitSpec]) -> None:
    """Stop each adopted process that still runs: SIGTERM to its process group when it leads one (setsid),
    else to it; SIGKILL after the stop timeout. Its GPUs are then verified free by the freeing step."""
    shell, clock = ctx.ports.shell, ctx.ports.clock
    for spec in specs:
        if spec.pid is None or not alive(shell, spec):
            continue
        stat = u.proc_stat(spec.pid, shell.read_file(f"/proc/{spec.pid}/stat"))
        target = f"-{spec.pid}" if stat is not None and stat.pgrp == spec.pid else str(spec.pid)
        ctx.emit("stop", unit=f"pid {spec.pid} ({spec.model}, adopted)")
        deadline = clock.monotonic() + ctx.defaults.stop_timeout_s
        sent = signal.SIGTERM
        shell.run(["kill", f"-{sent.name.removeprefix('SIG')}", "--", target], check=False)
        while alive(shell, spec):
            if clock.monotonic() >= deadline:
                if sent is signal.SIGKILL:
                    raise GpuBusy(
                        f"pid {spec.pid} ({spec.model}, adopted) still runs after SIGKILL", host=ctx.ports.host.name
                    )
                sent, deadline = signal.SIGKILL, clock.monotonic() + 10
                ctx.emit("reap", unit=f"pid {spec.pid}", pids=[spec.pid], signal="SIGKILL")
                shell.run(["kill", "-KILL", "--", target], check=False)
            ctx.pause(0.2)
