"""Run the pure planner against what a host really has, before anything is stopped."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from orchestrator.core import planner
from orchestrator.core.access import PROBE_SCRIPT, Account, Need, Walk, denial, fix_for, parse_probe
from orchestrator.core.catalog import Catalog
from orchestrator.core.documents import DocumentError, json_document
from orchestrator.core.observed import GpuSnapshot, listens_on
from orchestrator.core.planner_arch import check_model_config
from orchestrator.core.records import Deployment
from orchestrator.engines import engine_of_cgroup
from orchestrator.errors import AccessDenied, PlanError
from orchestrator.ports import HostPorts, Shell


def port_holder(
    shell: Shell, model: str, address: str, port: int, *, units: Iterable[str] = (), pids: Iterable[int] = ()
) -> str | None:
    """A process other than our engines listening where ``model``'s engine must (a peer tool, an engine
    started by hand): the engine could not bind, so a switch would stop the serving model only to roll
    back. Named with what `ss` says of it, before anything stops; None when the port is free or ours, or
    held by what this switch stops first: ``units`` (an adopted unit of any name) or ``pids`` (an
    adopted process started by hand)."""
    stopped = [f"/{u}".encode() for u in units]
    leaving = set(pids)

    def ours(pid: int) -> bool:
        cgroup = shell.read_file(f"/proc/{pid}/cgroup") or b""
        return (
            pid in leaving
            or engine_of_cgroup(cgroup) is not None
            or any(u + b"\n" in cgroup or u + b"/" in cgroup for u in stopped)
        )

    result = shell.run(["ss", "-Hltnp", f"( sport = :{port} )"], check=False, idempotent=True)
    for line in result.stdout.splitlines():
        if not listens_on(line, address, port):
            continue
        pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        if pids and all(ours(pid) for pid in pids):
            continue
        users = line.split("users:", 1)[1].strip() if "users:" in line else "a process ss does not name"
        return (
            f"{model}'s port {address}:{port} is already taken by {users}, not one of orchestrator's engines: "
            f"its engine could not listen there, so nothing was stopped; stop that process or give "
            f"models.{model}.port another port"
        )
    return None


def probe_access(shell: Shell, user: str, targets: list[str]) -> tuple[Account | None, dict[str, Walk]] | None:
    """The user's ids and every directory on the way to each target, in one command on the host; None
    when the host could not run it (no sh: nothing can be said, so nothing is refused)."""
    result = shell.run(["sh", "-c", PROBE_SCRIPT, "sh", user, *targets], check=False, idempotent=True)
    return None if result.exit_code != 0 else parse_probe(user, result.stdout)


def check_access(catalog: Catalog, model: str, ports: HostPorts, model_dir: str) -> None:
    """Refuse (exit 2) a switch whose unit's user cannot execute the engine or read the weights, before
    anything stops: a path walk with the user's uid and groups, cheap enough for every switch (doctor runs
    the engine itself). A user the host lacks is refused too: systemd would fail the unit (217/USER)."""
    user, engine = catalog.defaults.user, catalog.engine_command(ports.host, catalog.model(model))[0]
    probed = probe_access(ports.shell, user, [engine, model_dir])
    if probed is None:
        return
    account, walks = probed
    where = f"host {ports.host.name}: {model}'s unit"
    if account is None:
        raise AccessDenied(
            f"{where} runs as user {user} ([defaults] user), which host {ports.host.name} does "
            f"not have: create it (useradd --system {user}) or set [defaults] user; nothing was "
            "stopped"
        )
    checks: tuple[tuple[str, Need, bool, str], ...] = (
        (engine, "exec", True, "the engine (engine[0])"),
        (model_dir, "dir", False, "the model folder"),
    )
    for target, need, exists, key in checks:
        why = denial(walks.get(target, Walk(target, {})), account, need, must_exist=exists)
        if why is not None:
            raise AccessDenied(
                f"{where}, as user {user}, cannot use {key} {target}: {why}; nothing was stopped: " + fix_for(user)
            )


def _read_json(ports: HostPorts, path: str) -> dict[str, Any] | None:
    raw = ports.shell.read_file(path)
    if raw is None:
        return None
    try:
        data = json_document(raw, path, unique_keys=False)  # a config.json: read as the engine's loader reads it
    except DocumentError as exc:
        raise PlanError(f"{path}: {exc.reason}", host=ports.host.name) from exc
    return data if isinstance(data, dict) else None


def hardware_of(snap: GpuSnapshot, host_memory_gib: float, interconnect: str) -> planner.Hardware:
    """The planner's view of a host: GPU count and the smallest GPU's memory, as observed.

    Free memory is left out on purpose: this runs while the old model still holds the GPUs; the
    freeing step checks that memory is really released after the stop.
    """
    memory = min(g.memory_total_mib for g in snap.gpus) / 1024 if snap.gpus else host_memory_gib
    return planner.Hardware(
        gpu_count=len(snap.gpus),
        gpu_memory_gib=memory,
        interconnect=None if interconnect == "unknown" else interconnect,
    )


def check_layout(catalog: Catalog, dep: Deployment, ports: HostPorts, snap: GpuSnapshot) -> list[str]:
    """Raise PlanError when the model's layout cannot load on this host; return warnings.

    Needs the model's config.json on the host, so before staging it only runs for weights that
    are already there; staging runs it again, still before the serving model is stopped.
    """
    if dep.model not in catalog.models or dep.restores is not None:
        return []  # a recorded revision already loaded once on this host
    config = _read_json(ports, f"{dep.spec.model_dir}/config.json")
    if config is None:
        return []
    check_model_config(config, f"{ports.host.name}:{dep.spec.model_dir}/config.json")
    model = catalog.models[dep.model]
    index = _read_json(ports, f"{dep.spec.model_dir}/model.safetensors.index.json")
    layout = planner.Layout(
        tp=model.tensor_parallel, pp=model.pipeline_parallel, dp=model.data_parallel, ep=model.expert_parallel
    )
    workload = planner.Workload(
        max_model_len=model.max_model_len,
        gpu_memory_utilization=model.gpu_memory_utilization or catalog.defaults.gpu_memory_utilization,
    )
    weight_bytes = planner.weight_bytes_from_index(index) if index else None
    hw = hardware_of(snap, ports.host.gpu_memory_gib, ports.host.interconnect)
    if model.nodes:  # the same GPUs on every node; each node's were checked in its own preflight
        hw = replace(hw, nodes=len(model.nodes), network=ports.host.network)
    result = planner.plan(config, layout, hw, workload, weight_bytes=weight_bytes, engine=model.engine)
    verdict = result.requested
    if not verdict.valid:
        fix = f"; {verdict.fix}" if verdict.fix else ""
        raise PlanError(f"{dep.model} cannot load as {layout}: " + "; ".join(verdict.reasons) + fix, host=dep.host)
    return list(verdict.warnings)
