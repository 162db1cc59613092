"""`plan`: can this model load with this layout on these GPUs, and which layouts can."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from orchestrator import settings, userfiles
from orchestrator.adapters import hub_config
from orchestrator.adapters.hub_config import ModelConfig
from orchestrator.adapters.tune_store import read_feedback
from orchestrator.cli.options import int_in, json_option, nonempty, number_in, on_option
from orchestrator.cli.tables import print_table, stdout_console
from orchestrator.cli.target import backend, catalog, remote_spec
from orchestrator.contract.ops import EXPLAIN
from orchestrator.core import planner, tune
from orchestrator.core.catalog import Catalog, Host, Model
from orchestrator.core.planner_residency import ResidencyPlan, check_budget, plan_residency, render_residency
from orchestrator.core.render import model_dir_for
from orchestrator.core.weights import CONFIG_NAME, INDEX_NAME
from orchestrator.engines import ENGINE
from orchestrator.errors import OrchestratorError, UsageError


def _is_model_config(path: str | None) -> bool:
    """--config names a bare config.json (JSON) rather than a deploy.toml: by suffix, else by content."""
    if path is None:
        return False
    if path.endswith(".json"):
        return True
    if path.endswith(".toml"):
        return False
    try:
        head = userfiles.read_bytes(path)[:4096].lstrip()
    except userfiles.NotARegularFile as exc:
        raise UsageError(f"--config {path}: cannot read: {exc.strerror}") from None
    except OSError:
        return False  # settings.load says what is wrong with the file
    return head.startswith(b"{")


def _catalog_model_config(
    cat: Catalog, model: Model, host: Host, given: str | None, refresh: bool, *, remote: bool = False
) -> ModelConfig:
    """config.json of a catalog model: --model-config, the model's `config`, the weights staged on this
    machine, the cache of earlier fetches, and only then the hub. ``remote`` (--host): the catalog is
    the box's, so its `config` paths and staged weights are files there; only a shipped one is read."""
    if given:
        return ModelConfig(hub_config.read_model_config(given, "model config"), None, given)
    shipped = model.config is not None and Path(model.config).parent == settings.SHIPPED_CONFIGS
    if model.config and (shipped or not remote):
        return ModelConfig(
            hub_config.read_model_config(model.config, "model config"),
            None,
            f"{model.config} (models.{model.name}.config)",
        )
    if host.transport == "local" and not remote:
        staged = Path(model_dir_for(cat, model))
        if (staged / CONFIG_NAME).is_file():
            index_file = staged / INDEX_NAME
            return ModelConfig(
                hub_config.read_model_config(staged / CONFIG_NAME, "staged config"),
                hub_config.read_json_file(index_file, "staged index") if index_file.is_file() else None,
                f"staged weights in {staged}",
            )
    cached = None if refresh else hub_config.from_cache(model.repo, model.revision)
    if cached is not None:
        return cached
    try:
        return hub_config.from_hub(model.repo, model.revision)
    except OrchestratorError as exc:
        exc.message += (
            f"; models.{model.name}.config {model.config!r} is a file on the box: pass --model-config PATH"
            if remote and model.config
            else f"; set models.{model.name}.config to a local copy of config.json or pass --model-config PATH"
        )
        raise


@click.command()
@click.argument("model", required=False)
@click.option(
    "--config",
    "config",
    metavar="PATH",
    callback=nonempty,
    default=None,
    help="deploy.toml, or a model's bare config.json (with --gpus) to plan without a catalog",
)
@click.option("--model-config", metavar="PATH", callback=nonempty, default=None, help="config.json to use for MODEL")
@click.option(
    "--index",
    "index_path",
    metavar="PATH",
    callback=nonempty,
    default=None,
    help="model.safetensors.index.json, for the real weight bytes",
)
@on_option("the host of deploy.toml to plan for", dest="host_name")
@click.option("--gpus", type=int_in(1, 1024), default=None, help="GPU count (bare mode; per node)")
@click.option(
    "--nodes", type=int_in(1, 256), default=None, help="boxes of --gpus GPUs each, for a model larger than one box"
)
@click.option("--gpu-memory-gib", type=number_in(0.1, 65536), default=None, help="memory of each GPU")
@click.option("--tp", type=int_in(1, 1024), default=None, help="tensor parallel size")
@click.option("--pp", type=int_in(1, 1024), default=None, help="pipeline parallel size")
@click.option("--dp", type=int_in(1, 1024), default=None, help="data parallel size")
@click.option("--ep/--no-ep", default=None, help="expert parallel")
@click.option("--max-model-len", type=int_in(1, 2**31 - 1), default=None)
@click.option("--gpu-memory-utilization", type=number_in(0.05, 1.0), default=None)
@click.option("--refresh", is_flag=True, help="fetch config.json from the hub again instead of the cached copy")
@click.option("--all", "show_all", is_flag=True, help="list every valid layout, not the best few")
@click.option(
    "--serving",
    metavar="NAMES",
    default=None,
    help="warm switches: the host's models serving now, comma-separated (default: the records)",
)
@click.option(
    "--asleep",
    metavar="NAMES",
    default=None,
    help="warm switches: the host's models asleep now, least recently served first (default: the records)",
)
@json_option
def plan(
    model: str | None,
    config: str | None,
    model_config: str | None,
    index_path: str | None,
    host_name: str | None,
    gpus: int | None,
    nodes: int | None,
    gpu_memory_gib: float | None,
    tp: int | None,
    pp: int | None,
    dp: int | None,
    ep: bool | None,
    max_model_len: int | None,
    gpu_memory_utilization: float | None,
    refresh: bool,
    show_all: bool,
    serving: str | None,
    asleep: str | None,
    as_json: bool,
) -> None:
    """Say whether MODEL can load with its layout (or --tp/--ep...), why not, and what can.

    Exit status: 0 when the layout is valid, 3 when it is not, 2 for bad input, 4 when config.json
    is needed from the hub and the hub cannot be reached.
    """
    index = hub_config.read_json_file(index_path, "index") if index_path else None
    source: str | None = None
    if _is_model_config(config):
        assert config is not None
        cfg = hub_config.read_model_config(config, "model config")
        if gpus is None or gpu_memory_gib is None:
            raise UsageError("planning a bare config.json needs --gpus N and --gpu-memory-gib G")
        hw = planner.Hardware(gpu_count=gpus, gpu_memory_gib=gpu_memory_gib, nodes=nodes or 1)
        wl = planner.Workload(max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization or 0.9)
        requested = None if tp is None else planner.Layout(tp, pp or 1, dp or 1, bool(ep))
        name = Path(config).name
        engine = ENGINE  # a bare config.json: the default engine's rules
    else:
        if model is None and config is not None:
            # No MODEL: --config can only be a bare config.json, so say what is wrong with this one
            # (missing, unreadable, not JSON) rather than ask for what was given.
            try:
                hub_config.read_model_config(config, "model config")
            except OrchestratorError as exc:
                raise UsageError(
                    f"{exc}; without a MODEL, --config names a model's config.json (to plan a "
                    "model of a deploy.toml: orchestrator plan MODEL "
                    f"--config {shlex.quote(config)})"
                ) from None
        if model is None:
            raise UsageError("name a MODEL of the catalog, or plan a bare config.json with --config PATH --gpus N")
        remote = remote_spec() is not None
        cat = catalog(config)
        m = cat.model(model)
        host = cat.target(model, host_name or None)
        found = _catalog_model_config(cat, m, host, model_config, refresh, remote=remote)
        cfg, index, source = found.config, index or found.index, found.source
        # A multi-node model: its GPUs per node (the same on each) times its nodes.
        count = len(m.gpus) if m.nodes else host.gpus
        hw = planner.Hardware(
            gpu_count=gpus or count,
            gpu_memory_gib=gpu_memory_gib or host.gpu_memory_gib,
            interconnect=None if host.interconnect == "unknown" else host.interconnect,
            nodes=nodes or len(m.nodes) or 1,
            network=host.network,
        )
        wl = planner.Workload(
            max_model_len=max_model_len or m.max_model_len,
            gpu_memory_utilization=gpu_memory_utilization
            or m.gpu_memory_utilization
            or cat.defaults.gpu_memory_utilization,
        )
        requested = planner.Layout(
            tp or m.tensor_parallel,
            pp or m.pipeline_parallel,
            dp or m.data_parallel,
            m.expert_parallel if ep is None else ep,
        )
        name = model
        engine = m.engine
    weight_bytes = planner.weight_bytes_from_index(index) if index else None
    result = planner.plan(cfg, requested, hw, wl, weight_bytes=weight_bytes, engine=engine)
    note = ""
    if name == model and remote_spec() is None:  # tune's measurements are in this machine's state.db
        result, note = _measured(cat, host.name, model, result)
    switch = _switch_kind(config, name) if name == model else None
    warm = None
    if name == model:
        warm = _residency(
            cat,
            host,
            model,
            _weights_gib(cfg, index),
            switch,
            serving,
            asleep,
            remote=remote_spec() is not None,
            refresh=refresh,
        )
    elif serving is not None or asleep is not None:
        raise UsageError("--serving and --asleep plan a catalog model's warm switch: name a MODEL")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "name": name,
                    "config_source": source,
                    **result.to_dict(),
                    "ranking": note or "planner",
                    **({"switch": switch} if switch else {}),
                    **({"residency": warm.to_dict()} if warm else {}),
                },
                indent=2,
            )
        )
    else:
        _print(name, result, hw, source, limit=None if show_all else 6, note=note)
        if switch:
            click.echo(f"switch: {switch['mode'].replace('_', '-')}: {switch['reason']}")
        if warm:
            click.echo("\n".join(render_residency(warm)))
    if not result.valid:
        sys.exit(3)


def _weights_gib(cfg: Any, index: Any) -> float | None:
    """All ranks' weights in GiB: the index's real bytes, else the config's estimate."""
    found = planner.weight_bytes_from_index(index) if index else None
    found = found or planner.estimate_weight_bytes_from_config(cfg)
    return None if found is None else found / 2**30


def _names(value: str | None, cat: Catalog, host: Host, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    on = cat.models_on(host.name)
    for n in names:
        if n not in on:
            raise UsageError(
                f"{option} {value!r}: {n!r} is not a model of host {host.name} (its models: {', '.join(on) or 'none'})"
            )
    return names


def _residency(
    cat: Catalog,
    host: Host,
    model: str,
    weights: float | None,
    switch: dict[str, Any] | None,
    serving: str | None,
    asleep: str | None,
    *,
    remote: bool,
    refresh: bool,
) -> ResidencyPlan | None:
    """The host's warm-switch plan, when one of its models has sleep mode: the states come from
    --serving/--asleep, else the records (the switch's displaced models serve; its ``asleep`` entries,
    least recently served first, sleep)."""
    on = cat.models_on(host.name)
    if not any(cat.models[n].sleep for n in on):
        if serving is not None or asleep is not None:
            raise UsageError(f"--serving/--asleep: no model of host {host.name} has sleep mode (set models.NAME.sleep)")
        return None
    check_budget(cat, host, model, weights, "from its config.json")
    now_serving = _names(serving, cat, host, "--serving")
    if now_serving is None:
        now_serving = list((switch or {}).get("displaced", []))
    given = _names(asleep, cat, host, "--asleep")
    recorded = [(str(e["model"]), e.get("level"), e.get("last_served")) for e in (switch or {}).get("asleep", [])]
    sleepers = recorded if given is None else [(n, None, float(i)) for i, n in enumerate(given)]
    both = set(now_serving) & {n for n, _, _ in sleepers}
    if both:
        raise UsageError(f"--serving and --asleep both name {', '.join(sorted(both))}")
    weights_of = {n: _local_weights(cat, n, host, remote=remote, refresh=refresh) for n in on if n != model}
    weights_of[model] = weights
    return plan_residency(cat, host, weights_of, target=model, serving=now_serving, asleep=sleepers)


def _local_weights(cat: Catalog, name: str, host: Host, *, remote: bool, refresh: bool) -> float | None:
    """Another model's weights from what is here (its `config`, staged weights, the cache), never the hub."""
    m = cat.models[name]
    shipped = m.config is not None and Path(m.config).parent == settings.SHIPPED_CONFIGS
    try:
        if m.config and (shipped or not remote):
            return _weights_gib(hub_config.read_json_file(m.config, "model config"), None)
        if host.transport == "local" and not remote:
            staged = Path(model_dir_for(cat, m))
            if (staged / CONFIG_NAME).is_file():
                index_file = staged / INDEX_NAME
                return _weights_gib(
                    hub_config.read_json_file(staged / CONFIG_NAME, "staged config"),
                    hub_config.read_json_file(index_file, "staged index") if index_file.is_file() else None,
                )
        cached = None if refresh else hub_config.from_cache(m.repo, m.revision)
    except OrchestratorError:
        return None
    return None if cached is None else _weights_gib(cached.config, cached.index)


def _measured(cat: Catalog, host: str, model: str, result: planner.Plan) -> tuple[planner.Plan, str]:
    """What `tune` measured for this model on this host replaces the heuristic ranking."""
    failed, run = read_feedback(Path(cat.state_dir) / "state.db", host, model)
    failures = [tune.Failure(f.layout, f.error or "", f.at, f.run_id) for f in failed]
    ranking: list[tuple[str, float]] = []
    source = ""
    if run is not None and run.result is not None:
        dec = run.result["decision"]
        ranking = [(r["layout"].split(" ")[0], r["score"]) for r in dec["ranking"] if r["score"] is not None]
        source = f"{dec['objective']} {dec['unit']}, tune run #{run.id}"
    return tune.with_measurements(result, failures, ranking, source)


def _switch_kind(config: str | None, model: str) -> dict[str, Any] | None:
    """Handover or stop-start, from the host's recorded serving set (when there is a state store)."""
    if remote_spec() is not None:  # the box's records, through its agent
        return backend(config).call(EXPLAIN, {"model": model})
    cat = settings.load(config)
    try:
        if not (Path(cat.state_dir) / "state.db").exists():
            return None
    except PermissionError:  # not root, and no agent answered: the layout verdict needs no records
        return None
    from orchestrator.wiring import operations

    return operations(cat, reading=True).explain(model)


def _print(
    name: str, result: planner.Plan, hw: planner.Hardware, source: str | None, limit: int | None, note: str = ""
) -> None:
    console = stdout_console()
    v = result.requested
    mark = "[green]valid[/]" if v.valid else "[red]cannot load[/]"
    console.print(f"[bold]{name}[/] as {v.layout} on {hw}: {mark}")
    if source:
        console.print(f"  config.json: {source}", markup=False)
    for reason in v.reasons:
        console.print(f"  - {reason}", markup=False)
    for warning in v.warnings:
        console.print(f"  ! {warning}", markup=False)
    if v.memory:
        mem = v.memory
        console.print(
            f"  memory per GPU: weights {mem.weights_gib:.1f} GiB ({mem.weights_source}) + KV cache "
            f"{mem.kv_cache_gib:.1f} GiB + overhead {mem.overhead_gib:.1f} GiB = {mem.required_gib:.1f} "
            f"of {mem.budget_gib:.1f} GiB budget",
            markup=False,
        )
    if v.fix:
        console.print(f"  fix: {v.fix}", markup=False)
    if result.layouts:
        shown = result.layouts[:limit] if limit else result.layouts
        more = len(result.layouts) - len(shown)
        rows = [
            [
                str(n),
                str(lay.layout),
                str(lay.layout.gpus),
                f"{lay.memory.weights_gib:.1f} GiB" if lay.memory else "?",
                str(lay.memory.max_full_sequences) if lay.memory else "?",
            ]
            for n, lay in enumerate(shown, 1)
        ]
        console.print()
        print_table(
            console,
            ["#", "layout", "GPUs", "weights/GPU", "full-length seqs/replica"],
            rows,
            title="valid layouts, best first"
            + (f" ({more} more: --all)" if more else "")
            + (f"\n{note}" if note else ""),
            notes=[lay.why for lay in shown],
        )
