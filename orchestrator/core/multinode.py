"""A model larger than one box: its roles per node and their rendered units (pure).

Native backend (the engine's own, multiprocessing + torch.distributed): every node runs the engine with
the arguments of its place among the nodes (``Engine.node_args``: node count, rank, the first node's
address and port); rank 0 serves the API, the others run headless. Data parallel across nodes uses the
engine's DP arguments instead. Ray backend: a Ray head unit on the first node, a Ray worker unit on each
other node (``ray start --block``, ``--num-gpus`` = the GPUs it exposes), and the engine on the head with
what makes it use the Ray cluster (``Engine.ray_args``).

Start order is the order of ``nodes`` in the spec, then the API unit; stop is the reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jinja2

from orchestrator.core.catalog import Catalog, Host, Model
from orchestrator.core.ray_start import start_argv
from orchestrator.core.records import NodeUnit
from orchestrator.core.render import RenderedUnit, _plain, env_quote, exec_quote, model_dir_for, render_unit
from orchestrator.core.templating import compiled
from orchestrator.errors import RenderError

TemplateText = Callable[[str], str]
HEAD_TEMPLATE = "ray-head.service.j2"
WORKER_TEMPLATE = "ray-worker.service.j2"
# A Ray node holds no model state (the engine, stopped before it, needs the grace period): an idle
# node drains in under a second, and one still waiting for an unreachable head ignores SIGTERM
# until its GCS wait (40 s) ends, so waiting longer than this only delays a rollback.
RAY_STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Rendered:
    """A multi-node model's units: the API unit (rank 0 / the engine on the Ray head) and the rest."""

    api: RenderedUnit
    nodes: tuple[NodeUnit, ...]


def node_unit_name(model: Model, rank: int) -> str:
    return model.engine.unit_name(f"{model.name}-node{rank}")


def ray_unit_name(model: Model, role: str) -> str:
    return f"ray-{model.name}-{role.removeprefix('ray-')}.service"


def _node_env(model: Model, host: Host) -> dict[str, str]:
    """What every process of a node of ``model`` needs to find the others: its own address and interface."""
    env = model.engine.node_env(host.peer_address)
    if host.interface:
        env |= {"GLOO_SOCKET_IFNAME": host.interface, "NCCL_SOCKET_IFNAME": host.interface}
    return env


def _native_args(catalog: Catalog, model: Model, rank: int) -> tuple[str, ...]:
    head = catalog.model_host(model.name)
    n = len(model.nodes)
    per_node_ranks = model.tensor_parallel * model.pipeline_parallel
    # DP across nodes: each node runs data_parallel / n replicas of TP x PP.
    local = model.data_parallel // n if model.data_parallel > 1 and per_node_ranks <= len(model.gpus) else None
    return model.engine.node_args(
        nodes=n, rank=rank, head_address=head.peer_address, port=model.master_port, data_parallel_local=local
    )


def _ray(catalog: Catalog, host: Host) -> str:
    return host.ray or catalog.defaults.ray


def _render_ray(catalog: Catalog, model: Model, host: Host, role: str, template: str) -> RenderedUnit:
    head = catalog.model_host(model.name)
    d = catalog.defaults
    argv = start_argv(
        _ray(catalog, host),
        head=role == "ray-head",
        head_address=head.peer_address,
        ray_port=model.ray_port,
        node_address=host.peer_address,
        gpus=len(model.gpus),
        ray_args=model.ray_args,
    )
    # No drain on SIGTERM (Ray waits up to 30 s for Serve proxies to quiesce, and a head never
    # finishes): the engine, stopped before its Ray nodes, is what needs the grace period.
    env = {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, model.gpus)),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        **_node_env(model, host),
        **model.env,
    }
    name = ray_unit_name(model, role)
    try:
        text = compiled(template).render(
            name=name.removesuffix(".service"),
            description=_plain(
                f"Ray {role.removeprefix('ray-')} for {model.name} on {host.name}: GPUs "
                f"{','.join(map(str, model.gpus))}",
                "description",
            ),
            user=d.user,
            group=d.group,
            state_directory="ray",
            environment=[env_quote(k, v) for k, v in env.items()],
            exec_start=" ".join(exec_quote(a) for a in argv),
            timeout_stop=int(min(d.stop_timeout_s, RAY_STOP_TIMEOUT_S)),
        )
    except jinja2.TemplateError as exc:
        raise RenderError(f"template {role}.service.j2: {exc}") from exc
    return RenderedUnit(name=name, text=text)


def _node(host: Host, role: str, rank: int, unit: RenderedUnit, model_dir: str) -> NodeUnit:
    return NodeUnit(
        host=host.name,
        role=role,
        rank=rank,
        unit_name=unit.name,
        unit_text=unit.text,
        unit_sha=unit.sha256,
        model_dir=model_dir,
    )


def node_model_dir(catalog: Catalog, model: Model, host: Host, model_dir: str | None, revision: str | None) -> str:
    """Where a node's engine finds the weights: the node stages into its own models_dir (hosts may
    differ), so only the head uses ``model_dir`` as given; a ``local:`` source is one path everywhere."""
    if model_dir is not None and (
        host.name == catalog.nodes_of(model.name)[0].name or model.source.startswith("local:")
    ):
        return model_dir
    return model_dir_for(catalog, model, None if model.source.startswith("local:") else revision, host)


def render_nodes(
    catalog: Catalog,
    model: Model,
    templates: TemplateText,
    *,
    model_dir: str | None = None,
    revision: str | None = None,
) -> Rendered:
    """Every unit of a multi-node model, the API's apart; ``templates`` gives a template's text by name.
    ``model_dir`` is the head's weights directory, ``revision`` the staged revision every node has."""
    hosts = catalog.nodes_of(model.name)
    head = hosts[0]
    engine = templates(model.engine.template)
    # Ray's workers load the path the engine on the head names; a headless rank gets its own --model.
    dirs = {
        h.name: node_model_dir(catalog, model, head if model.backend == "ray" else h, model_dir, revision)
        for h in hosts
    }
    if model.backend == "ray":
        nodes = [
            _node(
                head,
                "ray-head",
                0,
                _render_ray(catalog, model, head, "ray-head", templates(HEAD_TEMPLATE)),
                dirs[head.name],
            )
        ]
        nodes += [
            _node(
                h,
                "ray-worker",
                r,
                _render_ray(catalog, model, h, "ray-worker", templates(WORKER_TEMPLATE)),
                dirs[h.name],
            )
            for r, h in enumerate(hosts[1:], 1)
        ]
        api = render_unit(
            catalog,
            model,
            engine,
            model_dir=model_dir,
            host=head,
            role="engine on the Ray head",
            extra_args=model.engine.ray_args,
            extra_env={**_node_env(model, head), "RAY_ADDRESS": f"{head.peer_address}:{model.ray_port}"},
        )
        return Rendered(api, tuple(nodes))
    nodes = [
        _node(
            h,
            "headless",
            r,
            render_unit(
                catalog,
                model,
                engine,
                model_dir=dirs[h.name],
                host=h,
                role=f"headless rank {r}",
                extra_args=_native_args(catalog, model, r),
                extra_env=_node_env(model, h),
                unit_name=node_unit_name(model, r),
            ),
            dirs[h.name],
        )
        for r, h in enumerate(hosts[1:], 1)
    ]
    api = render_unit(
        catalog,
        model,
        engine,
        model_dir=model_dir,
        host=head,
        role="rank 0, the API",
        extra_args=_native_args(catalog, model, 0),
        extra_env=_node_env(model, head),
    )
    return Rendered(api, tuple(nodes))


def unit_names(catalog: Catalog, model: Model) -> dict[str, set[str]]:
    """Every unit name a model uses, by host (a single-box model: its one unit on its host)."""
    hosts = catalog.nodes_of(model.name)
    out: dict[str, set[str]] = {hosts[0].name: {model.unit_name}}
    if model.backend == "ray" and model.nodes:
        out[hosts[0].name].add(ray_unit_name(model, "ray-head"))
        for h in hosts[1:]:
            out.setdefault(h.name, set()).add(ray_unit_name(model, "ray-worker"))
    elif model.nodes:
        for r, h in enumerate(hosts[1:], 1):
            out.setdefault(h.name, set()).add(node_unit_name(model, r))
    return out


def roles(catalog: Catalog, model: Model) -> list[tuple[str, str, str]]:
    """(host, role, unit) for every unit of a multi-node model, in start order."""
    hosts = catalog.nodes_of(model.name)
    if model.backend == "ray":
        rows = [(hosts[0].name, "ray-head", ray_unit_name(model, "ray-head"))]
        rows += [(h.name, "ray-worker", ray_unit_name(model, "ray-worker")) for h in hosts[1:]]
        return [*rows, (hosts[0].name, "engine", model.unit_name)]
    rows = [(h.name, f"headless rank {r}", node_unit_name(model, r)) for r, h in enumerate(hosts[1:], 1)]
    return [*rows, (hosts[0].name, "rank 0 (API)", model.unit_name)]
