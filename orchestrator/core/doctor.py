"""`orchestrator doctor`: what a box has, judged before anything runs there (pure: observations in,
one verdict per check out). The probing is deploy/doctor.py's."""

from __future__ import annotations

import posixpath
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.core.access import Account, Need, Walk, denial, fix_for
from orchestrator.core.observed import GpuSnapshot
from orchestrator.engines import ENGINE, Engine

Status = Literal["ok", "warn", "fail"]
GIB = 1 << 30
LOW_DISK_GIB = 10.0  # below this a staging of any real model fails part-way


@dataclass(frozen=True)
class Verdict:
    check: str  # what was checked: "systemd", "gpus", "engine alpha" ...
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status, "detail": self.detail, "fix": self.fix}


def ok(check: str, detail: str) -> Verdict:
    return Verdict(check, "ok", detail)


def report(host: str, verdicts: Sequence[Verdict]) -> dict[str, Any]:
    """The answer of the doctor operation: every line, and whether any failed (the CLI's exit 1)."""
    return {
        "host": host,
        "ok": not any(v.status == "fail" for v in verdicts),
        "checks": [v.to_dict() for v in verdicts],
    }


def lines(result: dict[str, Any]) -> list[str]:
    """The report as text: one line per check, its fix on the next."""
    out = [f"host {result['host']}:"]
    for c in result["checks"]:
        out.append(f"  {c['status']:<4} {c['check']}: {c['detail']}")
        if c["fix"]:
            out.append(f"       fix: {c['fix']}")
    return out


# -- the box ------------------------------------------------------------------------------------------
def unreachable_verdict(error: str) -> Verdict:
    return Verdict(
        "host",
        "fail",
        error,
        "the box must run systemd and D-Bus (locally) or sshd (ssh transport), reachable with the host's ssh settings",
    )


def systemd_verdict(error: str | None) -> Verdict:
    if error is None:
        return ok("systemd", "the manager answers over D-Bus")
    return Verdict(
        "systemd",
        "fail",
        f"cannot ask systemd: {error}",
        "the box must boot with systemd and run dbus (systemctl status dbus.service)",
    )


def gpu_verdict(snap: GpuSnapshot | None, error: str | None, driver: str | None) -> Verdict:
    if snap is None:
        return Verdict(
            "gpus",
            "fail",
            f"nvidia-smi did not answer: {error}",
            "install the NVIDIA driver (nvidia-smi must run as root on the box)",
        )
    if not snap.gpus:
        return Verdict("gpus", "warn", "nvidia-smi shows no GPU", "a CPU host can only run an engine's CPU build")
    names = sorted({g.name for g in snap.gpus})
    mem = min(g.memory_total_mib for g in snap.gpus) / 1024
    held = [f"PID {p.pid} {p.process_name} {p.used_memory_mib} MiB on GPU {p.gpu_index}" for p in snap.processes]
    return ok(
        "gpus",
        f"{len(snap.gpus)} x {', '.join(names)} ({mem:.1f} GiB each)"
        + (f", driver {driver}" if driver else "")
        + (f"; held: {'; '.join(held)}" if held else "; no process holds GPU memory"),
    )


def user_verdict(user: str, account: Account | None, probed: bool) -> Verdict:
    if not probed:
        return Verdict(f"user {user}", "warn", "the host did not run the path probe (no sh?): access unchecked")
    if account is None:
        return Verdict(
            f"user {user}",
            "fail",
            f"the engines' user {user} ([defaults] user) does not exist here",
            f"useradd --system {user}, or set [defaults] user to an account of this box",
        )
    return ok(f"user {user}", f"uid {account.uid}, groups {' '.join(map(str, sorted(account.gids)))}")


def access_verdict(
    check: str, what: str, walk: Walk, account: Account, need: Need, *, must_exist: bool = True
) -> Verdict:
    why = denial(walk, account, need, must_exist=must_exist)
    if why is None:
        return ok(
            check, f"{what} {walk.target}: user {account.name} can " + ("execute it" if need == "exec" else "read it")
        )
    return Verdict(check, "fail", f"{what} {walk.target}: {why}", fix_for(account.name))


@dataclass(frozen=True)
class EngineRun:
    """What the engine's interpreter said, run as the unit's user in a transient unit."""

    exit_code: int
    output: str
    version: str | None = None
    flags: frozenset[str] | None = None  # the API server's options; None: not read


# The import doctor runs with the engine's interpreter (the engine's own probe script; the default engine's).
ENGINE_SCRIPT = ENGINE.probe_script


def parse_engine_run(exit_code: int, output: str) -> EngineRun:
    version = None
    flags: set[str] = set()
    read = False
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "version":
            version = rest.strip()
        elif word == "flag":
            flags.add(rest.strip())
            read = True
    return EngineRun(exit_code, output, version, frozenset(flags) if read else None)


def is_python(path: str) -> bool:
    return re.fullmatch(r"python[0-9.]*", posixpath.basename(path)) is not None


def shebang_python(head: bytes) -> str | None:
    """The interpreter of a console script (an engine's /opt/venv/bin/ENGINE starts `#!/opt/venv/bin/python3`),
    so doctor can import the engine with it; None for a binary or another interpreter."""
    first = head.split(b"\n", 1)[0]
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return words[0] if words and words[0].startswith("/") and is_python(words[0]) else None


def engine_verdicts(
    model: str, user: str, engine: str, run: EngineRun | None, needs: Sequence[str], kind: Engine = ENGINE
) -> list[Verdict]:
    """The interpreter ran as the user in the unit's sandbox, the engine's (``kind``) version, and the
    flags ``needs``."""
    check, title = f"engine {model}", kind.title
    module = ", ".join(f'"{w}"' for w in kind.module_command)
    if run is None:
        return [
            Verdict(
                check,
                "warn",
                f"{engine} is not a python interpreter nor a python script: doctor cannot import {title} with it",
                f'name the environment\'s python as engine[0] (engine = [".../bin/python3", {module}]) '
                "for a full check",
            )
        ]
    if run.exit_code != 0 or run.version is None:
        tail = " | ".join(run.output.strip().splitlines()[-3:]) or "no output"
        return [
            Verdict(
                check,
                "fail",
                f"{engine} -c 'import {kind.name}' as user {user} in a transient unit "
                f"(PrivateTmp) exited {run.exit_code}: {tail}",
                f"install {title} into that environment, readable by {user}; or fix engine[0]",
            )
        ]
    out = [ok(check, f"{title} {run.version} imports with {engine} as user {user}")]
    if needs:
        if run.flags is None:
            out.append(
                Verdict(
                    f"flags {model}",
                    "warn",
                    f"could not read {title} {run.version}'s options: {', '.join(needs)} unchecked",
                )
            )
        else:
            missing = [f for f in needs if f not in run.flags]
            out.append(
                ok(f"flags {model}", f"{title} {run.version} has {', '.join(needs)}")
                if not missing
                else Verdict(
                    f"flags {model}",
                    "fail",
                    f"{title} {run.version} has no {', '.join(missing)}",
                    f"upgrade {title}, or drop the setting that needs it (sleep, expert_parallel)",
                )
            )
    return out


def needed_flags(sleep: bool, expert_parallel: bool, kind: Engine = ENGINE) -> list[str]:
    return kind.flags_needed(sleep=sleep, expert_parallel=expert_parallel)


def weights_verdict(
    model: str,
    folder: str,
    names: Iterable[str] | None,
    account: Account,
    walks: dict[str, Walk],
    *,
    staged_expected: bool,
) -> Verdict:
    """The model folder readable by the user, with config.json and, when sharded, its index."""
    check = f"weights {model}"
    walk = walks.get(folder, Walk(folder, {}))
    if names is None:
        if staged_expected:
            return Verdict(check, "fail", f"{folder} does not exist", "copy the weights there (its source is local:)")
        return Verdict(check, "warn", f"{folder} is not staged yet", f"orchestrator stage {model}")
    why = denial(walk, account, "dir")
    if why is not None:
        return Verdict(check, "fail", why, fix_for(account.name))
    listed = set(names)
    missing = [n for n in ("config.json",) if n not in listed]
    shards = [n for n in listed if n.endswith(".safetensors")]
    if len(shards) > 1 and "model.safetensors.index.json" not in listed:
        missing.append("model.safetensors.index.json")
    if missing:
        return Verdict(
            check,
            "fail",
            f"{folder} has no {', '.join(missing)}",
            "stage the model again (orchestrator stage) or copy the missing files",
        )
    for name in ("config.json", "model.safetensors.index.json"):
        if name in listed:
            path = posixpath.join(folder, name)
            leaf = denial(walks.get(path, Walk(path, {})), account, "read")
            if leaf is not None:
                return Verdict(check, "fail", leaf, f"chmod o+r {path} (or a group of {account.name})")
    return ok(
        check,
        f"{folder}: config.json"
        + (f" and index ({len(shards)} shards)" if len(shards) > 1 else "")
        + f", readable by {account.name}",
    )


def disk_verdict(models_dir: str, free_bytes: int | None) -> Verdict:
    if free_bytes is None:
        return Verdict("disk", "warn", f"could not read the free space under {models_dir}")
    gib = free_bytes / GIB
    if gib < LOW_DISK_GIB:
        return Verdict(
            "disk",
            "warn",
            f"{gib:.1f} GiB free under {models_dir} (models_dir): too little to stage a model",
            "free space, or point models_dir at a larger disk",
        )
    return ok("disk", f"{gib:.1f} GiB free under {models_dir} (models_dir)")


def devices_verdict(nodes: dict[str, Walk], account: Account | None) -> Verdict:
    if not nodes:
        return Verdict("devices", "warn", "no /dev/nvidia* device node here (a CPU host?)")
    if account is None:
        return Verdict("devices", "warn", f"{len(nodes)} /dev/nvidia* nodes; their user is unknown")
    denied = [
        w.target
        for w in nodes.values()
        if (st := w.stats.get(w.target)) is not None and stat.S_ISCHR(st.mode) and denial(w, account, "rw") is not None
    ]
    if denied:
        return Verdict(
            "devices",
            "fail",
            f"user {account.name} cannot open {', '.join(sorted(denied))} for read and write",
            f"add {account.name} to the devices' group (video), or fix the driver's device modes",
        )
    return ok("devices", f"{len(nodes)} /dev/nvidia* nodes, usable by {account.name}")


def ram_verdict(
    memory_gib: float | None,
    sleep_ram_gib: float | None,
    budget_gib: float | None,
    meminfo_gib: float | None,
    sleepers: Sequence[str],
) -> Verdict:
    if not sleepers:
        return ok("ram", f"{meminfo_gib:.1f} GiB of host RAM; no model sleeps" if meminfo_gib else "no model sleeps")
    if meminfo_gib is None:
        return Verdict("ram", "warn", "could not read /proc/meminfo: the sleep budget is unchecked")
    for key, value in (("sleep_ram_gib", sleep_ram_gib), ("memory_gib", memory_gib)):
        if value is not None and value > meminfo_gib * 1.02:
            return Verdict(
                "ram",
                "fail",
                f"{key} {value:g} is more than the {meminfo_gib:.1f} GiB this host has",
                f"lower hosts.*.{key} to what the box has",
            )
    return ok(
        "ram",
        f"{meminfo_gib:.1f} GiB of host RAM; sleepers ({', '.join(sleepers)}) may hold "
        + (f"{budget_gib:.1f} GiB" if budget_gib is not None else "an unknown budget"),
    )


def haproxy_verdict(path: str, version: str | None, error: str | None) -> Verdict:
    if version is None:
        return Verdict("haproxy", "fail", f"{path} -v failed: {error}", "apt-get install haproxy (2.6 or newer)")
    return ok("haproxy", version)


def port_verdict(what: str, port: int, holder: str | None) -> Verdict:
    if holder is None:
        return ok(f"port {port}", f"{what}: free or ours")
    return Verdict(
        f"port {port}",
        "fail",
        f"{what} is taken by {holder}, not one of orchestrator's units",
        "stop that process, or give this listener another port in deploy.toml",
    )


def group_verdict(group: str, exists: bool) -> Verdict:
    if exists:
        return ok("socket group", f"{group} exists")
    return Verdict(
        "socket group",
        "warn",
        f"group {group} (socket_group) does not exist: only root may use the agent",
        f"groupadd --system {group} (`orchestrator agent install` makes it)",
    )
