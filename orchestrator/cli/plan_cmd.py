"""`plan`: can this model load with this layout on these GPUs, and which layouts can."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from orchestrator import settings
from orchestrator.cli import main
from orchestrator.cli.options import json_option
from orchestrator.core import planner
from orchestrator.errors import UsageError


def _load_json(path: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"{what} {path}: file not found") from exc
    except (ValueError, OSError) as exc:
        raise UsageError(f"{what} {path}: not readable JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def _is_model_config(path: str | None, gpus: int | None) -> bool:
    if path is None:
        return False
    if gpus is not None or path.endswith(".json"):
        return True
    try:
        tomllib.loads(Path(path).read_text())
        return False
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
        return True


def _hub_config(repo: str, revision: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """config.json (and the safetensors index, when there is one) straight from the hub."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    try:
        cfg = _load_json(hf_hub_download(repo, "config.json", revision=revision), f"{repo} config.json")
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise UsageError(f"cannot read config.json of {repo}@{revision} from the hub: {exc}; "
                         "pass --model-config PATH") from exc
    try:
        index = _load_json(hf_hub_download(repo, "model.safetensors.index.json", revision=revision), "index")
    except (EntryNotFoundError, HfHubHTTPError, OSError, ValueError, UsageError):
        index = None
    return cfg, index


@main.command()
@click.argument("model", required=False)
@click.option("--config", "config", metavar="PATH", default=None,
              help="deploy.toml, or a model's bare config.json (with --gpus) to plan without a catalog")
@click.option("--model-config", metavar="PATH", default=None, help="config.json to use for MODEL")
@click.option("--index", "index_path", metavar="PATH", default=None,
              help="model.safetensors.index.json, for the real weight bytes")
@click.option("--host", "host_name", default=None, help="host of the catalog to plan for")
@click.option("--gpus", type=click.IntRange(1, 1024), default=None, help="GPU count (bare mode)")
@click.option("--gpu-memory-gib", type=click.FloatRange(min=0.1), default=None, help="memory of each GPU")
@click.option("--tp", type=click.IntRange(1, 1024), default=None, help="tensor parallel size")
@click.option("--pp", type=click.IntRange(1, 1024), default=None, help="pipeline parallel size")
@click.option("--dp", type=click.IntRange(1, 1024), default=None, help="data parallel size")
@click.option("--ep/--no-ep", default=None, help="expert parallel")
@click.option("--max-model-len", type=click.IntRange(1), default=None)
@click.option("--gpu-memory-utilization", type=click.FloatRange(0.05, 1.0), default=None)
@click.option("--all", "show_all", is_flag=True, help="list every valid layout, not the best few")
@json_option
def plan(model: str | None, config: str | None, model_config: str | None, index_path: str | None,
         host_name: str | None, gpus: int | None, gpu_memory_gib: float | None, tp: int | None,
         pp: int | None, dp: int | None, ep: bool | None, max_model_len: int | None,
         gpu_memory_utilization: float | None, show_all: bool, as_json: bool) -> None:
    """Say whether MODEL can load with its layout (or --tp/--ep...), why not, and what can.

    Exit status: 0 when the layout is valid, 3 when it is not, 2 for bad input.
    """
    index = _load_json(index_path, "index") if index_path else None
    if _is_model_config(config, gpus):
        assert config is not None
        cfg = _load_json(config, "model config")
        if gpus is None or gpu_memory_gib is None:
            raise UsageError("planning a bare config.json needs --gpus N and --gpu-memory-gib G")
        hw = planner.Hardware(gpu_count=gpus, gpu_memory_gib=gpu_memory_gib)
        wl = planner.Workload(max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization or 0.9)
        requested = None if tp is None else planner.Layout(tp, pp or 1, dp or 1, bool(ep))
        name = Path(config).name
    else:
        if model is None:
            raise UsageError("name a MODEL of the catalog, or plan a bare config.json with --config PATH --gpus N")
        cat = settings.load(config)
        if model not in cat.models:
            raise UsageError(f"unknown model {model!r} (known: {', '.join(sorted(cat.models))})")
        m = cat.models[model]
        if host_name and host_name not in cat.hosts:
            raise UsageError(f"unknown host {host_name!r} (known: {', '.join(sorted(cat.hosts))})")
        host = cat.hosts[host_name] if host_name else cat.model_host(model)
        if model_config:
            cfg = _load_json(model_config, "model config")
        else:
            cfg, hub_index = _hub_config(m.repo, m.revision)
            index = index or hub_index
        hw = planner.Hardware(gpu_count=gpus or host.gpus, gpu_memory_gib=gpu_memory_gib or host.gpu_memory_gib,
                              interconnect=None if host.interconnect == "unknown" else host.interconnect)
        wl = planner.Workload(max_model_len=max_model_len or m.max_model_len,
                              gpu_memory_utilization=gpu_memory_utilization or m.gpu_memory_utilization
                              or cat.defaults.gpu_memory_utilization)
        requested = planner.Layout(tp or m.tensor_parallel, pp or m.pipeline_parallel, dp or m.data_parallel,
                                   m.expert_parallel if ep is None else ep)
        name = model
    weight_bytes = planner.weight_bytes_from_index(index) if index else None
    result = planner.plan(cfg, requested, hw, wl, weight_bytes=weight_bytes)
    switch = _switch_kind(config, name) if model is not None and not _is_model_config(config, gpus) else None
    if as_json:
        click.echo(json.dumps({"name": name, **result.to_dict(), **({"switch": switch} if switch else {})},
                              indent=2))
    else:
        _print(name, result, hw, limit=None if show_all else 6)
        if switch:
            click.echo(f"switch: {switch['mode'].replace('_', '-')}: {switch['reason']}")
    if not result.valid:
        sys.exit(3)


def _switch_kind(config: str | None, model: str) -> dict[str, Any] | None:
    """Handover or stop-start, from the host's recorded serving set (when there is a state store)."""
    cat = settings.load(config)
    if not (Path(cat.state_dir) / "state.db").exists():
        return None
    from orchestrator.wiring import operations
    return operations(cat).explain(model)


def _print(name: str, result: planner.Plan, hw: planner.Hardware, limit: int | None) -> None:
    console = Console()
    v = result.requested
    mark = "[green]valid[/]" if v.valid else "[red]cannot load[/]"
    console.print(f"[bold]{name}[/] as {v.layout} on {hw.gpu_count} x {hw.gpu_memory_gib:g} GiB: {mark}")
    for reason in v.reasons:
        console.print(f"  - {reason}", markup=False)
    for warning in v.warnings:
        console.print(f"  ! {warning}", markup=False)
    if v.memory:
        mem = v.memory
        console.print(f"  memory per GPU: weights {mem.weights_gib:.1f} GiB ({mem.weights_source}) + KV cache "
                      f"{mem.kv_cache_gib:.1f} GiB + overhead {mem.overhead_gib:.1f} GiB = {mem.required_gib:.1f} "
                      f"of {mem.budget_gib:.1f} GiB budget", markup=False)
    if v.fix:
        console.print(f"  fix: {v.fix}", markup=False)
    if result.layouts:
        shown = result.layouts[:limit] if limit else result.layouts
        more = len(result.layouts) - len(shown)
        table = Table("layout", "GPUs", "weights/GPU", "full-length seqs/replica", "why",
                      title="valid layouts, best first" + (f" ({more} more: --all)" if more else ""))
        for lay in shown:
            fit = lay.memory
            table.add_row(str(lay.layout), str(lay.layout.gpus), f"{fit.weights_gib:.1f} GiB" if fit else "?",
                          str(fit.max_full_sequences) if fit else "?", lay.why)
        console.print(table)
