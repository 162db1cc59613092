"""`tune`: measure the candidate layouts of a model on its host and keep the fastest."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from orchestrator import settings
from orchestrator.adapters.hub_config import read_model_config
from orchestrator.cli.options import (
    MAX_COUNT,
    MAX_SECONDS,
    config_option,
    int_in,
    json_option,
    nonempty,
    number_in,
    on_option,
)
from orchestrator.cli.progress import with_progress
from orchestrator.cli.tables import print_table, stdout_console
from orchestrator.cli.target import backend
from orchestrator.client.backends import AgentClient
from orchestrator.contract.ops import (
    CONFIG_PUSH,
    CONFIG_SHOW,
    TUNE_ABORT,
    TUNE_FOLLOW,
    TUNE_PLAN,
    TUNE_RESUME,
    TUNE_START,
    TUNE_STATUS,
)
from orchestrator.core import tune as core
from orchestrator.core.tune_chart import svg_chart, text_chart
from orchestrator.core.tune_toml import edit_model
from orchestrator.errors import AgentError, Detached, TransportError, UsageError
from orchestrator.loadgen import BenchPlan
from orchestrator.rollout.tune import Tuner, TuneRequest
from orchestrator.wiring import operations


@click.command()
@click.argument("model", required=False)
@config_option
@click.option(
    "--layouts",
    default=None,
    metavar="L1,L2",
    help="layouts to try, e.g. tp4,tp8+ep (default: the planner's best --top)",
)
@click.option(
    "--top", type=int_in(1, 16), default=3, show_default=True, help="how many of the planner's valid layouts to try"
)
@click.option("--max-num-seqs", "seqs", default=None, metavar="N1,N2", help="also vary the engine's max_num_seqs")
@click.option("--objective", default=None, help=core.OBJECTIVES_HELP + " [default: throughput at the highest level]")
@click.option("--concurrency", default="1,64,256", show_default=True, help="levels, comma-separated")
@click.option("--max-tokens", type=int_in(1, MAX_COUNT), default=512, show_default=True)
@click.option("--prompt-tokens", type=int_in(1, MAX_COUNT), default=128, show_default=True)
@click.option("--duration", type=number_in(0.1, MAX_SECONDS), default=None, help="seconds per level (default 30)")
@click.option("--requests", "requests_", type=int_in(1, MAX_COUNT), default=None, help="requests per level")
@click.option(
    "--repeats",
    type=int_in(1, 20),
    default=1,
    show_default=True,
    help="benchmark each candidate this many times, to see the noise",
)
@click.option("--restore", is_flag=True, help="bring back what served before instead of leaving the winner")
@click.option("--apply", "apply_", is_flag=True, help="write the winner's layout into deploy.toml")
@click.option(
    "--chart", "chart", default=None, metavar="FILE.svg", callback=nonempty, help="also write the chart as an SVG image"
)
@click.option(
    "--model-config",
    default=None,
    metavar="PATH",
    callback=nonempty,
    help="config.json to plan with (default: the host's)",
)
@click.option(
    "--resume", is_flag=True, help="finish the host's unfinished tune run (MODEL, if given, must be the run's)"
)
@click.option("--abort", is_flag=True, help="stop the host's unfinished tune run; what served before returns")
@click.option("--follow", is_flag=True, help="re-attach to the host's tune run in its agent; its report at the end")
@click.option("--status", "show_status", is_flag=True, help="the host's tune run in its agent: what it measured so far")
@on_option("the host of deploy.toml for --resume/--abort/--follow/--status (default: the only one, or MODEL's)")
@click.option("--yes", "-y", is_flag=True, help="do not ask before stopping what serves")
@json_option
def tune(
    model: str | None,
    config: str | None,
    layouts: str | None,
    top: int,
    seqs: str | None,
    objective: str | None,
    concurrency: str,
    max_tokens: int,
    prompt_tokens: int,
    duration: float | None,
    requests_: int | None,
    repeats: int,
    restore: bool,
    apply_: bool,
    chart: str | None,
    model_config: str | None,
    resume: bool,
    abort: bool,
    follow: bool,
    show_status: bool,
    host: str | None,
    yes: bool,
    as_json: bool,
) -> None:
    """Deploy each candidate layout of MODEL (a safe switch each), benchmark it, keep the winner.

    With an agent (--host BOX, or this deploy.toml's agent) the run is a job of the agent that owns the
    model's host: Ctrl-C or a lost connection only detach; --follow re-attaches from any client.

    Exit status: 0 with a winner, 1 when no candidate could be measured (or the run was aborted),
    2 for bad input, 130 when detached.
    """
    # Every argument is checked before anything is read from a host.
    modes = [
        flag
        for flag, on in (("--resume", resume), ("--abort", abort), ("--follow", follow), ("--status", show_status))
        if on
    ]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} exclude each other")
    if not modes and model is None:
        raise UsageError(
            "name a MODEL to tune, or give --resume / --abort / --follow / --status (with MODEL: that model's run)"
        )
    if chart is not None and not chart.endswith(".svg"):
        raise UsageError(f"--chart {chart!r}: only SVG is written (no plotting dependency); name a .svg file")
    levels = core.parse_concurrency(concurrency)
    plan = BenchPlan(
        concurrency=levels, max_tokens=max_tokens, prompt_tokens=prompt_tokens, duration_s=duration, requests=requests_
    )
    obj = objective or f"throughput@{max(levels)}"
    core.parse_objective(obj, levels)
    wanted = core.parse_layouts(layouts) if layouts is not None else None
    seq_caps = core.parse_seqs(seqs)
    cfg_json = read_model_config(model_config, "--model-config") if model_config else None
    client = backend(config)
    if isinstance(client, AgentClient):
        args = {
            "model": model,
            "layouts": layouts,
            "top": top,
            "seqs": seqs,
            "objective": obj,
            "concurrency": list(levels),
            "max_tokens": max_tokens,
            "prompt_tokens": prompt_tokens,
            "duration_s": duration,
            "requests": requests_,
            "repeats": repeats,
            "restore": restore,
            "config_json": cfg_json,
        }
        mode = (modes or ["start"])[0].removeprefix("--")
        through_agent(
            client, mode, args, {"host": host, "model": model}, yes=yes, apply_=apply_, chart=chart, as_json=as_json
        )
        return
    if follow or show_status:
        raise UsageError(
            f"tune {modes[0]} reads a run in an agent: give --host BOX (or run the agent with this "
            "deploy.toml); a tune run in a CLI is followed where it runs"
        )
    path = settings.config_path(config)
    ops = operations(settings.load(config))
    if abort:
        result = with_progress(as_json, lambda p: Tuner(ops, path, p).abort(host, model))
        click.echo(
            json.dumps(result, indent=2)
            if as_json
            else f"tune run #{result['run']} aborted; serving: {_serving(result['serving'])}"
        )
        return
    if resume:
        report = with_progress(as_json, lambda p: Tuner(ops, path, p).resume(host, model))
    else:
        assert model is not None
        req = TuneRequest(model, wanted, top, seq_caps, obj, plan, repeats, restore, cfg_json)
        prep = with_progress(as_json, lambda p: Tuner(ops, path, p).prepare(req))
        _show_plan(prep.summary(), yes)
        report = with_progress(as_json, lambda p: Tuner(ops, path, p).start(prep))
    applied = Tuner(ops, path).apply(report["model"], report) if apply_ else False
    if chart:
        Path(chart).write_text(svg_chart(report))
    _print(report, as_json, applied, chart)
    if report["decision"]["winner"] is None:
        sys.exit(1)


def _show_plan(plan: dict[str, Any], yes: bool) -> None:
    """The plan of the run (Prepared.summary) on stderr, then a confirmation (unless --yes) before anything stops."""
    err = Console(stderr=True, highlight=False)
    err.print(
        f"tune {plan['model']} on host {plan['host']}: {len(plan['candidates'])} candidates, objective "
        f"{plan['objective']}, concurrency {','.join(map(str, plan['concurrency']))}",
        markup=False,
    )
    for i, c in enumerate(plan["candidates"], 1):
        err.print(f"  {i}. {c['label']:<16} as {c['name']}", markup=False)
    err.print(f"  estimated: {plan['estimate']}", markup=False)
    now = f"{plan['previous_model']} (revision {plan['previous_revision']})" if plan["previous_model"] else "nothing"
    after = "what serves now" if plan["restore"] else "the winner"
    err.print(f"  serving now: {now}; it stops for the first candidate; afterwards {after} serves", markup=False)
    if yes:
        return
    if not sys.stdin.isatty():
        raise UsageError("tune stops what serves: confirm on a terminal, or pass --yes")
    if not click.confirm("go ahead?", default=False, err=True):
        raise UsageError("tune cancelled: nothing was stopped")


def _serving(s: dict[str, Any]) -> str:
    return f"{s['model']} (revision {s['revision']})" if s else "nothing"


def _cell(lv: dict[str, Any] | None) -> str:
    if lv is None:
        return "-"
    ttft = f"{lv['ttft_p90_ms']:,.0f} ms" if lv["ttft_p90_ms"] is not None else "-"
    return f"{lv['tok_s']:,.0f}, {ttft}"


def _print(report: dict[str, Any], as_json: bool, applied: bool, chart: str | None) -> None:
    if as_json:
        click.echo(json.dumps({**report, "applied": applied, "chart": chart}, indent=2))
        return
    dec = report["decision"]
    levels = report["concurrency"]
    headers = ["", "layout", "status", *[f"C={c} tok/s, TTFT p90" for c in levels], "errors", dec["unit"]]
    rows = [
        [
            "*" if row["winner"] else "",
            row["layout"],
            "ok" if row["status"] == "ok" else "failed",
            *[_cell(row["levels"].get(str(c))) for c in levels],
            str(sum(v["errors"] for v in row["levels"].values())) if row["levels"] else "-",
            f"{row['score']:,.1f}" if row["score"] is not None else "-",
        ]
        for row in report["candidates"]
    ]
    # a box table only on a terminal wide enough; through a pipe plain columns, one row a line
    print_table(
        stdout_console(),
        headers,
        rows,
        title=f"tune run #{report['run']}: {report['model']} on {report['host']}, objective {dec['objective']}",
    )
    for row in report["candidates"]:
        if row["status"] != "ok":
            click.echo(f"{row['layout']} failed to load: {row['error']}")
    click.echo(text_chart(report))
    if dec["winner"]:
        margin = f", {dec['margin_pct']:.1f}% ahead of {dec['runner_up']}" if dec["margin_pct"] is not None else ""
        noise = f" (noise {dec['noise_pct']:.1f}%)" if dec["noise_pct"] is not None else ""
        click.echo(f"winner: {dec['winner']}{margin}{noise}" + (f"; {dec['note']}" if dec["note"] else ""))
    else:
        click.echo(f"no winner: {dec['note']}")
    click.echo(f"serving: {_serving(report['serving'])}")
    if report["diff"]:
        click.echo(
            ("applied to deploy.toml:\n" if applied else "deploy.toml change (write it with --apply):\n")
            + report["diff"].rstrip("\n")
        )
    elif report["diff"] == "":
        click.echo("deploy.toml already has the winner's layout")
    if chart:
        click.echo(f"chart written to {chart}")


# -- through an agent: the run is a job of the agent that owns the model's host ---------------------------
def through_agent(
    client: AgentClient,
    mode: str,
    args: dict[str, Any],
    which: dict[str, Any],
    *,
    yes: bool,
    apply_: bool,
    chart: str | None,
    as_json: bool,
) -> None:
    if mode == "status":
        shown = client.call(TUNE_STATUS, which)
        click.echo(json.dumps(shown, indent=2) if as_json else _status_line(shown))
        return
    if mode == "start":
        plan = with_progress(as_json, lambda p: client.call(TUNE_PLAN, args, p))
        _show_plan(plan, yes)
        result = _attached(client, TUNE_START, args, plan["host"], as_json)
    else:
        op = {"resume": TUNE_RESUME, "abort": TUNE_ABORT, "follow": TUNE_FOLLOW}[mode]
        result = _attached(client, op, which, which["host"], as_json)
    if result.get("state") == "aborted":
        click.echo(
            json.dumps(result, indent=2)
            if as_json
            else f"tune run #{result['run']} aborted; serving: {_serving(result['serving'])}"
        )
        if mode != "abort":
            sys.exit(1)
        return
    if "decision" not in result:  # --follow with nothing running: the last run as recorded
        click.echo(json.dumps(result, indent=2) if as_json else _status_line(result))
        return
    applied = _apply_through(client, result) if apply_ else False
    if chart:
        Path(chart).write_text(svg_chart(result))
    _print(result, as_json, applied, chart)
    if result["decision"]["winner"] is None:
        sys.exit(1)


def _attached(client: AgentClient, op: Any, args: dict[str, Any], host: str | None, as_json: bool) -> dict[str, Any]:
    """One streamed tune request; Ctrl-C or a lost agent detach (the run goes on there)."""
    again = f"`orchestrator {client.follow_hint}tune --follow" + (f" --on {host}`" if host else "`")
    try:
        return dict(with_progress(as_json, lambda p: client.call(op, args, p)))
    except Detached:
        raise Detached(f"detached from the tune run: it goes on in the agent; {again} re-attaches") from None
    except (AgentError, TransportError) as exc:
        if "closed the connection" not in str(exc) and not isinstance(exc, TransportError):
            raise  # the agent's own answer (a refusal, a failed run): as it came
        lost = type(exc)(
            f"lost the agent while following the tune run ({str(exc).splitlines()[0]}); the run is "
            f"the agent's and goes on there (or resumes when the agent restarts); {again} re-attaches"
        )
        lost.exit_code = exc.exit_code
        raise lost from None


def _apply_through(client: AgentClient, report: dict[str, Any]) -> bool:
    """--apply with an agent: the winner's layout into the agent's deploy.toml (a config push: checked there)."""
    changes = report.get("changes") or {}
    if not changes:
        return False
    shown = client.call(CONFIG_SHOW, {})
    text = edit_model(str(shown["text"]), report["model"], changes, str(shown["path"]))
    client.call(CONFIG_PUSH, {"text": text, "name": f"tune run #{report['run']} --apply"})
    return True


def _status_line(shown: dict[str, Any]) -> str:
    run = shown.get("run")
    if run is None:
        return f"host {shown['host']}: no tune run recorded"
    running = f"; the agent runs it now ({shown['running']})" if shown.get("running") else ""
    return (
        f"tune run #{run['id']} of {run['model']} on host {shown['host']}: {run['state']}, "
        f"{len(run['measured'])} of {len(run['candidates'])} candidates measured{running}"
    )
