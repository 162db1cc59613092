"""`bench` and `compare`: throughput of what serves, recorded with its revision."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from orchestrator import settings
from orchestrator.adapters.smoke import bench_record
from orchestrator.cli.options import (
    MAX_COUNT,
    MAX_SECONDS,
    config_option,
    int_in,
    json_option,
    number_in,
    on_option,
    printed,
)
from orchestrator.cli.tables import print_table, stdout_console
from orchestrator.cli.target import local_only
from orchestrator.core.tune import parse_concurrency
from orchestrator.deploy.locks import activity_lock
from orchestrator.deploy.operations import Operations
from orchestrator.errors import UsageError
from orchestrator.loadgen import BenchPlan, BenchTarget, Progress, run_bench_blocking
from orchestrator.wiring import operations


def _serving(ops: Operations, host: str | None) -> Any:
    serving = ops.serving(host)
    if serving is None:
        raise UsageError(
            f"host {ops.catalog.target(host=host).name} serves nothing recorded as active: switch to a model first"
        )
    return serving


@click.command()
@config_option
@on_option("the host of deploy.toml whose serving model is measured (default: the only one)")
@click.option("--concurrency", default="1,16,64,256", show_default=True, help="levels, comma-separated")
@click.option("--max-tokens", type=int_in(1, MAX_COUNT), default=512, show_default=True)
@click.option("--prompt-tokens", type=int_in(1, MAX_COUNT), default=128, show_default=True)
@click.option("--duration", type=number_in(0.1, MAX_SECONDS), default=None, help="seconds per level (default 30)")
@click.option("--requests", "requests_", type=int_in(1, MAX_COUNT), default=None, help="requests per level")
@click.option("--no-record", is_flag=True, help="do not store the result with the revision")
@json_option
def bench(
    config: str | None,
    host: str | None,
    concurrency: str,
    max_tokens: int,
    prompt_tokens: int,
    duration: float | None,
    requests_: int | None,
    no_record: bool,
    as_json: bool,
) -> None:
    """Measure output tok/s, TTFT and ITL of the active deployment at rising concurrency."""
    local_only("bench")
    # Every argument is checked before anything is read from a host.
    plan = BenchPlan(
        concurrency=parse_concurrency(concurrency),
        max_tokens=max_tokens,
        prompt_tokens=prompt_tokens,
        duration_s=duration,
        requests=requests_,
    )
    ops = operations(settings.load(config))
    serving = _serving(ops, host)
    target = BenchTarget(base_url=serving.spec.base_url, model=serving.spec.served_name)
    console = Console(stderr=True)
    with Live(console=console, transient=True, refresh_per_second=4, redirect_stdout=False) as live:

        def show(p: Progress) -> None:
            if not as_json:
                live.update(
                    f"C={p.concurrency} ({p.level_index + 1}/{p.levels}) {p.elapsed_s:5.1f}s of {p.target}: "
                    f"{p.requests_ok} ok, {p.requests_failed} failed, {p.in_flight} in flight, "
                    f"{p.streamed_tok_s:,.0f} tok/s"
                )

        # Held while it runs: on-demand swaps and idle sleeps wait for it (its load bypasses the proxy).
        with activity_lock(ops.state_dir, serving.host, "bench", f"a bench of {serving.model} is running"):
            result = run_bench_blocking(target, plan, on_progress=show)
    record = bench_record(result.to_dict())
    if not no_record:
        ops.record_bench(serving.id, record)
    if as_json:
        click.echo(json.dumps(record, indent=2))
    else:
        rows = []
        for lv in record["levels"]:
            errors = ", ".join(f"{e['kind']} x{e['count']}" for e in lv.get("errors", [])) or "0"
            rows.append(
                [
                    str(lv["concurrency"]),
                    f"{lv['output_tok_s']:,.1f}",
                    f"{lv['output_tok_s_per_stream']:,.1f}",
                    f"{lv['requests_per_s']:.2f}",
                    _dist(lv["ttft_ms"]),
                    _dist(lv["itl_ms"]),
                    errors,
                ]
            )
        print_table(
            stdout_console(),
            ["C", "out tok/s", "per stream", "req/s", "TTFT p50/p90/p99 ms", "ITL p50/p90/p99 ms", "errors"],
            rows,
            title=f"{serving.model} revision {serving.revision} ({serving.spec.base_url})"
            + ("" if result.complete else " - cancelled, partial"),
        )
    if not result.complete:
        sys.exit(130)


def _dist(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    return "/".join(f"{d[k]:.1f}" if d.get(k) is not None else "-" for k in ("p50", "p90", "p99"))


@click.command()
@config_option
@on_option("the host of deploy.toml whose benchmarks are compared (default: the only one)")
@json_option
def compare(config: str | None, host: str | None, as_json: bool) -> None:
    """Every model benchmarked on a host, side by side per concurrency level (latest run of each)."""
    local_only("compare")
    ops = operations(settings.load(config), reading=True)
    name = ops.catalog.target(host=host).name
    rows: list[dict[str, Any]] = [
        {
            "model": d.model,
            "revision": d.revision,
            "unit_sha256": d.spec.unit_sha,
            "tok_s": {str(lv["concurrency"]): lv["output_tok_s"] for lv in (d.bench or {})["levels"]},
        }
        for d in ops.benchmarks(name)
    ]
    if printed(rows, as_json, empty=lambda: f"no benchmarks recorded yet on host {name}"):
        return
    levels = sorted({int(c) for r in rows for c in r["tok_s"]})
    print_table(
        stdout_console(),
        ["model", "rev", *[f"C={c} tok/s" for c in levels]],
        [
            [
                r["model"],
                str(r["revision"]),
                *[f"{r['tok_s'][str(c)]:,.0f}" if str(c) in r["tok_s"] else "-" for c in levels],
            ]
            for r in rows
        ],
        title=f"output tok/s on {name}",
    )
