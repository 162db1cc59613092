"""`orchestrator doctor`'s probes: what the box has, asked through the host's ports (its shell, systemd and
GPU adapters: locally, through the agent, or over SSH), judged by core/doctor.py."""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.core import doctor as d
from orchestrator.core.access import Walk
from orchestrator.core.catalog import Catalog
from orchestrator.core.doctor import Verdict
from orchestrator.core.observed import GpuSnapshot, listens_on
from orchestrator.core.render import engine_bind
from orchestrator.deploy.preflight import probe_access
from orchestrator.engines import engine_of_cgroup
from orchestrator.errors import OrchestratorError
from orchestrator.ports import HostPorts, Shell

ENGINE_RUN_TIMEOUT_S = 300.0  # importing an engine (torch, CUDA) takes tens of seconds on a cold cache
# A listener of ours: a model's engine (engines.engine_of_cgroup), the agent (metrics), the front proxy.
_OURS = re.compile(rb"/orchestrator-[^/]*\.service(/|$)", re.MULTILINE)


def _ours(cgroup: bytes) -> bool:
    return engine_of_cgroup(cgroup) is not None or _OURS.search(cgroup) is not None


def diagnose(catalog: Catalog, ports: HostPorts, units: dict[str, tuple[str, str]]) -> list[Verdict]:
    """Every check of the box and of each model of ``units`` (its rendered unit's text, its model folder)."""
    shell, host = ports.shell, ports.host
    out = [_systemd(ports), _gpus(ports)]
    user, group = catalog.defaults.user, catalog.defaults.group
    # The host's engine command, then each other one a model's engine runs (`engine_name`).
    commands = {name: catalog.engine_command(host, catalog.models[name])[0] for name in units}
    paths = list(dict.fromkeys([catalog.engine_command(host)[0], *commands.values()]))
    folders = {name: folder for name, (_, folder) in units.items()}
    nodes = _device_nodes(shell)
    files = [f"{f}/{n}" for f in folders.values() for n in ("config.json", "model.safetensors.index.json")]
    probed = probe_access(shell, user, [*paths, *folders.values(), *files, *nodes])
    account, walks = probed if probed is not None else (None, {})
    out.append(d.user_verdict(user, account, probed is not None))
    reachable = dict.fromkeys(paths, True)
    if account is not None:
        for i, engine in enumerate(paths):
            check = "engine path" if i == 0 else f"engine path {engine}"
            path = d.access_verdict(check, "the engine", walks.get(engine, Walk(engine, {})), account, "exec")
            reachable[engine] = path.status == "ok"
            out.append(path)
    # One probe per distinct run: models of one engine with the same environment would each pay the
    # engine's import (~20 s on a GPU box) for the same answer.
    runs: dict[tuple[str, tuple[str, ...], str], d.EngineRun] = {}
    for name, (unit_text, folder) in units.items():
        model, engine = catalog.models[name], commands[name]
        needs = d.needed_flags(model.sleep is not None, model.expert_parallel, model.engine)
        if not reachable[engine]:  # its unit would die with 203/EXEC: the line above says why
            out.append(Verdict(f"engine {name}", "fail", f"not run: user {user} cannot reach {engine} (engine path)"))
        else:
            python = engine if d.is_python(engine) else _script_python(shell, engine)
            script = model.engine.probe_script
            run = None
            if python is not None:
                key = (python, tuple(unit_environment(unit_text)), script)
                if key not in runs:
                    runs[key] = _engine_run(shell, python, user, group, unit_text, script)
                run = runs[key]
            out += d.engine_verdicts(name, user, python or engine, run, needs, model.engine)
        if account is not None and model.source != "none":
            out.append(
                d.weights_verdict(
                    name,
                    folder,
                    _listing(shell, folder),
                    account,
                    walks,
                    staged_expected=model.source.startswith("local:"),
                )
            )
    out.append(d.disk_verdict(host.models_dir, _free_bytes(shell, host.models_dir)))
    out.append(d.devices_verdict({n: walks.get(n, Walk(n, {})) for n in nodes}, account))
    meminfo = _meminfo_gib(shell)
    sleepers = [n for n in units if catalog.models[n].sleep is not None]
    out.append(d.ram_verdict(host.memory_gib, host.sleep_ram_gib, host.sleep_ram_budget(meminfo), meminfo, sleepers))
    if catalog.proxy.enabled:
        out.append(_haproxy(shell, catalog.proxy.haproxy))
    out += _ports(catalog, ports, list(units))
    out.append(
        d.group_verdict(
            catalog.socket_group,
            shell.run(["getent", "group", catalog.socket_group], check=False, idempotent=True).exit_code == 0,
        )
    )
    return out


def _systemd(ports: HostPorts) -> Verdict:
    try:
        ports.systemd.unit_state("dbus.service")
    except OrchestratorError as exc:
        return d.systemd_verdict(str(exc))
    return d.systemd_verdict(None)


def _gpus(ports: HostPorts) -> Verdict:
    snap: GpuSnapshot | None = None
    error = None
    try:
        snap = ports.gpus.snapshot()
    except OrchestratorError as exc:
        error = str(exc)
    driver = ports.shell.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], check=False, idempotent=True
    )
    version = driver.stdout.strip().splitlines()[0].strip() if driver.exit_code == 0 and driver.stdout.strip() else None
    return d.gpu_verdict(snap, error, version)


def _device_nodes(shell: Shell) -> list[str]:
    result = shell.run(
        ["sh", "-c", 'for f in /dev/nvidia*; do [ -e "$f" ] && echo "$f"; done; true'], check=False, idempotent=True
    )
    return [line for line in result.stdout.splitlines() if line.startswith("/dev/nvidia")]


def unit_environment(unit_text: str) -> list[str]:
    """The unit's Environment= values as written (systemd-run -p reads them with the unit file's rules)."""
    return [line.removeprefix("Environment=") for line in unit_text.splitlines() if line.startswith("Environment=")]


def _engine_run(
    shell: Shell, engine: str, user: str, group: str, unit_text: str, script: str = d.ENGINE_SCRIPT
) -> d.EngineRun:
    """The interpreter as systemd runs the unit (its user and group, PrivateTmp, its environment) running
    the engine's probe ``script``."""
    argv = [
        "systemd-run",
        "--wait",
        "--pipe",
        "--quiet",
        "--collect",
        "-p",
        f"User={user}",
        "-p",
        f"Group={group}",
        "-p",
        "PrivateTmp=yes",
        "-p",
        "NoNewPrivileges=yes",
        "-p",
        "WorkingDirectory=/",
    ]
    for env in unit_environment(unit_text):
        argv += ["-p", f"Environment={env}"]
    argv += [engine, "-c", script]
    result = shell.run(argv, check=False, timeout=ENGINE_RUN_TIMEOUT_S)
    return d.parse_engine_run(result.exit_code, result.stdout + result.stderr)


def _script_python(shell: Shell, engine: str) -> str | None:
    result = shell.run(["head", "-c", "256", "--", engine], check=False, idempotent=True)
    return d.shebang_python(result.stdout.encode()) if result.exit_code == 0 else None


def _listing(shell: Shell, folder: str) -> list[str] | None:
    result = shell.run(["ls", "-1A", "--", folder], check=False, idempotent=True)
    return result.stdout.splitlines() if result.exit_code == 0 else None


def _free_bytes(shell: Shell, path: str) -> int | None:
    """Free bytes on the filesystem of ``path`` (its nearest existing directory: staging makes the rest)."""
    script = 'p=$1; while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done; df -P -B1 -- "$p"'
    result = shell.run(["sh", "-c", script, "sh", path], check=False, idempotent=True)
    rows = result.stdout.strip().splitlines()
    fields = rows[-1].split() if result.exit_code == 0 and len(rows) > 1 else []
    return int(fields[3]) if len(fields) > 3 and fields[3].isdigit() else None


def _meminfo_gib(shell: Shell) -> float | None:
    raw = shell.read_file("/proc/meminfo") or b""
    found = re.search(rb"^MemTotal:\s+(\d+) kB", raw, re.MULTILINE)
    return int(found.group(1)) / (1 << 20) if found else None


def _haproxy(shell: Shell, path: str) -> Verdict:
    result = shell.run([path, "-v"], check=False, idempotent=True)
    first = (result.stdout or result.stderr).strip().splitlines()
    if result.exit_code != 0 or not first:
        return d.haproxy_verdict(path, None, (first[0] if first else f"exit {result.exit_code}"))
    return d.haproxy_verdict(path, first[0], None)


def _ports(catalog: Catalog, ports: HostPorts, models: Sequence[str]) -> list[Verdict]:
    """Each model's port, the proxy's and the agent's metrics port: taken by something not ours?"""
    host = ports.host
    bind = host.bind or catalog.defaults.bind
    wanted = [(f"{m}'s engine", engine_bind(catalog, catalog.models[m], host), catalog.models[m].port) for m in models]
    if catalog.proxy.enabled:
        wanted.append(("the front proxy", catalog.proxy.bind or bind, catalog.proxy.port))
    if catalog.metrics_port:
        wanted.append(("the agent's metrics", "127.0.0.1", catalog.metrics_port))
    listening = ports.shell.run(["ss", "-Hltnp"], check=False, idempotent=True).stdout.splitlines()
    return [
        d.port_verdict(what, port, _foreign(ports.shell, listening, address, port)) for what, address, port in wanted
    ]


def _foreign(shell: Shell, listening: list[str], address: str, port: int) -> str | None:
    for line in listening:
        if not listens_on(line, address, port):
            continue
        pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        if pids and all(_ours(shell.read_file(f"/proc/{pid}/cgroup") or b"") for pid in pids):
            continue
        return line.split("users:", 1)[1].strip() if "users:" in line else "a process ss does not name"
    return None
