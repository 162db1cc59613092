"""The steps of a multi-node deployment: the same phases, acted out on every node of the model.

The deployment is recorded on the model's first node (the API's); every action here observes
before it acts, so re-running a phase after a crash repeats nothing that already happened on any
node. Start order: the spec's extra units in order (headless ranks; or the Ray head, the Ray
workers, then a wait until the cluster shows every node), then the API unit; stop is the reverse.
A failure on any node fails the step, and the engine's rollback stops the model on every node and
brings back what served on each.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.core.records import NodeUnit, UnitSpec
from orchestrator.deploy import actions
from orchestrator.deploy.context import StepContext
from orchestrator.errors import HealthCheckFailed, OrchestratorError, PlanError, WeightsError

RAY_VERSION_RE = re.compile(r"version\s+(\S+)")
NODE_PROGRESS = "node_progress"  # the store's event kind for what a step did to one unit of one node


def record(ctx: StepContext, step: str, host: str, unit: str, sha: str, **detail: object) -> None:
    """Persist (then report) one unit's progress: installed, started, ready."""
    ctx.record(NODE_PROGRESS, {"step": step, "node": host, "unit": unit, "sha256": sha, **detail})
    ctx.emit(f"node_{step}", node=host, unit=unit, **detail)


def recorded(progress: Iterable[Mapping[str, Any]], step: str, phase: str) -> set[tuple[str, str, str]]:
    """(node, unit, sha256) of the units a deployment's ``phase`` recorded as ``step``."""
    return {
        (str(e["node"]), str(e["unit"]), str(e["sha256"]))
        for e in progress
        if e.get("step") == step and e.get("phase") == phase
    }


def api_progress(ctx: StepContext, spec: UnitSpec, step: str) -> None:
    """Rank 0 / the engine on the head is one of the model's units too: record it like the others."""
    if spec.nodes:
        record(ctx, step, ctx.ports.host.name, spec.unit_name, spec.unit_sha, role="api")


def _node_ctx(ctx: StepContext, host: str) -> StepContext:
    if ctx.node_ctx is None or host == ctx.ports.host.name:
        return ctx
    return ctx.node_ctx(host)


def _as_spec(spec: UnitSpec, node: NodeUnit) -> UnitSpec:
    """A node's unit in the shape the single-host actions take (it has no API of its own)."""
    return UnitSpec(
        model=spec.model,
        unit_name=node.unit_name,
        unit_text=node.unit_text,
        unit_sha=node.unit_sha,
        served_name=spec.served_name,
        address=spec.address,
        port=spec.port,
        gpus=spec.gpus,
        load_deadline_s=spec.load_deadline_s,
        model_dir=node.model_dir or spec.model_dir,
        repo=spec.repo,
        revision=spec.revision,
        source=spec.source,
        engine=spec.engine,
    )


def preflight(ctx: StepContext, spec: UnitSpec) -> None:
    """Every node answers, has the GPUs the model names, and (Ray) runs the same Ray version."""
    for host in spec.node_hosts:
        nctx = _node_ctx(ctx, host)
        snap = nctx.ports.gpus.snapshot()
        missing = sorted(set(spec.gpus) - {g.index for g in snap.gpus})
        if missing:
            raise PlanError(
                f"{spec.model} needs GPU {','.join(map(str, spec.gpus))} on node {host} but "
                f"nvidia-smi there shows {len(snap.gpus)} GPU(s)",
                host=host,
            )
        ctx.emit("node_preflight", node=host, gpus=len(snap.gpus))
    if spec.backend == "ray":
        check_ray_versions(ctx, spec)


def _ray_cli(ctx: StepContext, host: str) -> str:
    nctx = _node_ctx(ctx, host)
    return nctx.ports.host.ray or nctx.catalog.defaults.ray


def ray_version(ctx: StepContext, host: str) -> str:
    nctx = _node_ctx(ctx, host)
    ray = _ray_cli(ctx, host)
    result = nctx.ports.shell.run([ray, "--version"], timeout=120, check=False)
    found = RAY_VERSION_RE.search(result.stdout)
    if result.exit_code != 0 or found is None:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PlanError(f"node {host}: `{ray} --version` failed (exit {result.exit_code}): {detail[0]}", host=host)
    return found.group(1)


def check_ray_versions(ctx: StepContext, spec: UnitSpec) -> None:
    """Ray refuses to join nodes of different versions, late and obscurely: refuse it here, first."""
    versions = {host: ray_version(ctx, host) for host in (ctx.ports.host.name, *spec.node_hosts)}
    ctx.emit("ray_versions", versions=versions)
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{h} has Ray {v}" for h, v in versions.items())
        raise PlanError(f"{spec.model}: every node needs the same Ray version: {listed}", host=ctx.ports.host.name)


def stage(ctx: StepContext, spec: UnitSpec) -> None:
    """The weights on every other node, each into its own models_dir (the head stages through the
    usual step); a node whose weights land elsewhere than its unit reads them from is refused."""
    for node in spec.nodes:
        nctx = _node_ctx(ctx, node.host)
        if node.host == ctx.ports.host.name or spec.source == "none" or nctx.ports.weights is None:
            continue
        want = _as_spec(spec, node)
        staged = nctx.ports.weights.stage(want, nctx.progress)
        ctx.emit("staged", node=node.host, path=staged.path, revision=staged.revision, bytes=staged.total_bytes)
        if node.model_dir and staged.path != want.model_dir:
            why = (
                " (Ray's workers read the head's path: give every node the same models_dir)"
                if spec.backend == "ray"
                else ""
            )
            raise WeightsError(
                f"{spec.model}: node {node.host} staged the weights into {staged.path} but "
                f"{node.unit_name} reads them from {want.model_dir}{why}",
                host=node.host,
            )


def preinstall(ctx: StepContext, spec: UnitSpec) -> None:
    """Write and load the node units that are not running yet, while the old model serves."""
    for node in spec.nodes:
        nctx = _node_ctx(ctx, node.host)
        if not nctx.ports.systemd.unit_state(node.unit_name).is_active:
            actions.install_unit(nctx, _as_spec(spec, node))


def stop(ctx: StepContext, units: Mapping[str, frozenset[str]], keep: frozenset[tuple[str, str]] = frozenset()) -> None:
    """Stop units on other hosts (and the head's extra ones), in the order given (reverse start);
    ``keep``: (host, unit) pairs this deployment already brought back, left running."""
    for host, names in units.items():
        nctx = _node_ctx(ctx, host)
        for unit in actions.stop_units(nctx, {n for n in names if (host, n) not in keep}):
            # A Ray node stuck waiting for its head ends by SIGKILL after TimeoutStopSec, which marks
            # the unit failed; the stop was ours (the journal keeps the story), so clear it.
            if nctx.ports.systemd.unit_state(unit).is_failed:
                nctx.ports.systemd.reset_failed(unit)


def free(
    ctx: StepContext,
    spec: UnitSpec,
    units: Mapping[str, frozenset[str]],
    keep: frozenset[tuple[str, str]] = frozenset(),
) -> None:
    for host in spec.node_hosts:
        # A node whose unit of ``spec`` already runs again (a resumed rollback) holds the GPUs by right.
        if host != ctx.ports.host.name and not any(h == host for h, _ in keep):
            actions.free_gpus(_node_ctx(ctx, host), spec.gpus, units.get(host, frozenset()))


def install(ctx: StepContext, spec: UnitSpec) -> None:
    for node in spec.nodes:
        actions.install_unit(_node_ctx(ctx, node.host), _as_spec(spec, node))
        record(ctx, "installed", node.host, node.unit_name, node.unit_sha, role=node.role)


def start(ctx: StepContext, spec: UnitSpec) -> None:
    """The node units in order; with Ray, wait for the whole cluster before the engine may start.
    A unit already running (started before a crash, by this very step) is left as it is."""
    for node in spec.nodes:
        nctx = _node_ctx(ctx, node.host)
        if nctx.ports.systemd.unit_state(node.unit_name).is_active:
            ctx.emit("node_running", node=node.host, role=node.role, unit=node.unit_name)
            continue
        ctx.emit("node_start", node=node.host, role=node.role, unit=node.unit_name)
        actions.start_unit(nctx, _as_spec(spec, node))
        record(ctx, "started", node.host, node.unit_name, node.unit_sha, role=node.role)
    if spec.backend == "ray":
        wait_ray_cluster(ctx, spec)


@dataclass(frozen=True)
class RayNode:
    """One alive node as `ray status -v` lists it: its id and its resource totals (CPU, GPU, ...)."""

    node_id: str
    totals: Mapping[str, float]

    def shown(self) -> str:
        return f"{self.node_id[:8]}: {self.totals.get('GPU', 0):g} GPU, {self.totals.get('CPU', 0):g} CPU"


_NODE_RE = re.compile(r"^Node: ([0-9a-f]+)\b(.*?)(?=^Node: |\Z)", re.MULTILINE | re.DOTALL)
# "  0.0/1.0 GPU", or with a placement group "  1.0/1.0 GPU (1.0 used of 1.0 reserved in placement groups)"
_USAGE_RE = re.compile(r"^\s+[\d.]+/([\d.]+)\s+(\S+)(?:\s+\(.*\))?\s*$", re.MULTILINE)


def ray_status_nodes(text: str) -> list[RayNode]:
    """The alive nodes of a cluster from `ray status -v`: its per-node "Node: <id>" blocks.

    Why this source: `ray list nodes` and the state API go through the dashboard, which the head
    runs without; `ray.nodes()` needs a driver (a job in the cluster, files in the session dir, as
    root); Ray's GcsClient is private. `ray status` reads the GCS, answers in a fraction of a second
    and is the command operators use. Only its per-node blocks name each node with its own
    resources; byte-valued ones (memory, object store) are skipped. Checked against real outputs
    of Ray 2.60 in tests/fixtures/ray/.
    """
    nodes = []
    for found in _NODE_RE.finditer(text):
        totals = {name: float(total) for total, name in _USAGE_RE.findall(found.group(2))}
        nodes.append(RayNode(found.group(1), totals))
    return nodes


def _ray_address(spec: UnitSpec) -> str:
    found = re.search(r'"RAY_ADDRESS=([^"]+)"', spec.unit_text)
    return found.group(1) if found else ""


def resumed(
    ctx: StepContext, spec: UnitSpec, progress: Iterable[Mapping[str, Any]], phase: str
) -> frozenset[tuple[str, str]]:
    """(host, unit) of ``spec`` that ``phase`` of this deployment started before a crash and that
    still run that very unit: re-running the phase must not stop them (a rank's restart is a new
    process group the others do not know)."""
    started = recorded(progress, "started", phase)
    if not started:
        return frozenset()
    units = [(n.host, n.unit_name, n.unit_sha) for n in spec.nodes] + [
        (ctx.ports.host.name, spec.unit_name, spec.unit_sha)
    ]
    return frozenset(
        (h, u)
        for h, u, sha in units
        if (h, u, sha) in started and _node_ctx(ctx, h).ports.systemd.unit_state(u).is_active
    )


def wait_ray_cluster(ctx: StepContext, spec: UnitSpec) -> None:
    """Until `ray status` on the head shows every node with the model's GPUs and a CPU.

    Bounded by defaults.ray_join_timeout_s, not the load deadline: a worker that cannot reach the
    head waits for it for minutes (`ray start --block` retries the GCS), and a unit that dies
    fails it at once.
    """
    head = next(n for n in spec.nodes if n.role == "ray-head")
    want = len(spec.nodes)
    address = _ray_address(spec)
    ray = _ray_cli(ctx, ctx.ports.host.name)
    clock = ctx.ports.clock
    timeout = ctx.defaults.ray_join_timeout_s
    start_at = clock.monotonic()
    nodes: list[RayNode] = []
    last = ""
    while True:
        for node in spec.nodes:
            nctx = _node_ctx(ctx, node.host)
            state = nctx.ports.systemd.unit_state(node.unit_name)
            if not state.is_active:
                raise HealthCheckFailed(
                    f"{node.unit_name} on {node.host} is {state.active_state} "
                    f"({state.sub_state}) while the Ray cluster forms" + actions.journal_hint(nctx, node.unit_name),
                    host=node.host,
                    unit=node.unit_name,
                )
        left = timeout - (clock.monotonic() - start_at)
        argv = [ray, "status", "-v"] + (["--address", address] if address else [])
        result = ctx.ports.shell.run(argv, timeout=max(5.0, min(60.0, left)), check=False)
        nodes = ray_status_nodes(result.stdout) if result.exit_code == 0 else []
        last = ((result.stdout if result.exit_code == 0 else result.stderr).strip().splitlines()[-1:] or [""])[0]
        ready = [n for n in nodes if n.totals.get("GPU", 0) >= len(spec.gpus) and n.totals.get("CPU", 0) > 0]
        if len(ready) >= want:
            ctx.emit("ray_cluster", nodes=[n.shown() for n in nodes], seconds=round(clock.monotonic() - start_at, 3))
            return
        if clock.monotonic() - start_at > timeout:
            expected = ", ".join(f"{n.host} ({n.role})" for n in spec.nodes)
            seen = "; ".join(n.shown() for n in nodes) or f"none (last line of `ray status`: {last})"
            raise HealthCheckFailed(
                f"Ray cluster of {spec.model} at {address or 'the head'} shows {len(ready)} of {want} nodes "
                f"with {len(spec.gpus)} GPU(s) each after ray_join_timeout_s = {timeout:g} s; expected "
                f"{expected}; seen: {seen}" + node_hints(ctx, spec),
                host=ctx.ports.host.name,
                unit=head.unit_name,
            )
        ctx.pause(max(ctx.defaults.health_interval_s, 0.5))


def node_hints(ctx: StepContext, spec: UnitSpec) -> str:
    """The journals of the other nodes: a failed rank's reason is often only there."""
    return "".join(
        f"\n--- node {n.host} ({n.role}):" + actions.journal_hint(_node_ctx(ctx, n.host), n.unit_name)
        for n in spec.nodes
    )


def wait_ready(ctx: StepContext, spec: UnitSpec) -> None:
    """A real completion through the API unit, and every node still running afterwards."""
    if not spec.nodes:
        actions.wait_ready(ctx, spec)
        return
    try:
        actions.wait_ready(ctx, spec)
    except HealthCheckFailed as exc:
        raise HealthCheckFailed(f"{exc}{node_hints(ctx, spec)}", host=ctx.ports.host.name, unit=spec.unit_name) from exc
    states = []
    for node in spec.nodes:
        nctx = _node_ctx(ctx, node.host)
        state = nctx.ports.systemd.unit_state(node.unit_name)
        if not state.is_active:
            raise HealthCheckFailed(
                f"{node.unit_name} on {node.host} is {state.active_state} after the API "
                "answered" + actions.journal_hint(nctx, node.unit_name),
                host=node.host,
                unit=node.unit_name,
            )
        states.append((node, state))
    # The restart counts the watch compares against (Engine.is_healthy): a rank systemd restarted
    # on its own later is a new process the others never joined.
    for node, state in states:
        record(ctx, "ready", node.host, node.unit_name, node.unit_sha, role=node.role, n_restarts=state.n_restarts)
    api = ctx.ports.systemd.unit_state(spec.unit_name)
    record(ctx, "ready", ctx.ports.host.name, spec.unit_name, spec.unit_sha, role="api", n_restarts=api.n_restarts)


def settle(ctx: StepContext, spec: UnitSpec, stopped: Mapping[str, frozenset[str]]) -> None:
    """After the model proved healthy: its node units come back on reboot, the stopped ones do not."""
    mine = {(n.host, n.unit_name) for n in spec.nodes}
    changed: dict[str, bool] = {}  # per node: one daemon-reload for every link that changed there
    for host, names in stopped.items():
        nctx = _node_ctx(ctx, host)
        for unit in sorted(names):
            if (host, unit) not in mine and unit != spec.unit_name and nctx.ports.systemd.unit_state(unit).exists:
                changed[host] = nctx.ports.systemd.disable(unit, reload=False) | changed.get(host, False)
    for node in spec.nodes:
        did = _node_ctx(ctx, node.host).ports.systemd.enable(node.unit_name, reload=False)
        changed[node.host] = did | changed.get(node.host, False)
    for host in sorted(h for h, did in changed.items() if did):
        _node_ctx(ctx, host).ports.systemd.daemon_reload()


def restore_peers(ctx: StepContext, specs: Mapping[str, UnitSpec]) -> None:
    """What served on the other nodes before the switch, back; every node is tried before failing."""
    errors = []
    for host, spec in specs.items():
        nctx = _node_ctx(ctx, host)
        ctx.emit("node_restore", node=host, model=spec.model, unit=spec.unit_name)
        try:
            actions.install_unit(nctx, spec)
            actions.start_unit(nctx, spec)
            actions.wait_ready(nctx, spec)
            nctx.ports.systemd.enable(spec.unit_name)
        except OrchestratorError as exc:
            errors.append(f"node {host}: {spec.model}: {exc}")
    if errors:
        raise HealthCheckFailed(
            "could not bring back what served on the other nodes: " + "; ".join(errors), host=ctx.ports.host.name
        )
