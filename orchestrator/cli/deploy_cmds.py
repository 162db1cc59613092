"""`switch`, `rollback`, `status`, `history`, `recover`: operations on hosts."""

from __future__ import annotations

import json
import re
import sys
import time
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from orchestrator.cli.options import (
    config_option,
    int_in,
    json_option,
    local_option,
    on_option,
    printed,
    read_local_option,
)
from orchestrator.cli.progress import with_progress
from orchestrator.cli.tables import print_table, stdout_console
from orchestrator.cli.target import backend, remote_spec, run_model_job
from orchestrator.contract.ops import (
    CHECK_TOGETHER,
    EXPLAIN,
    FOLLOW,
    HISTORY,
    RECOVER,
    ROLLBACK,
    STATUS,
    STOP,
    SWITCH,
)
from orchestrator.core.records import SwitchResult
from orchestrator.core.states import Phase, is_terminal, text_of
from orchestrator.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.ports import ProgressCallback


def _finish(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result.get("noop"):
        click.echo(result["message"])
    else:
        outcome = result["outcome"]
        # a rollback is a new revision that redeploys a recorded one's unit: name both
        to = re.search(r":to-(\d+)$", str(result.get("trigger") or ""))
        again = f", the unit of revision {to.group(1)}" if to else ""
        line = f"revision {result['revision']} ({result['model']}{again}) on {result['host']}: {outcome}"
        click.echo(line)
        for key in ("error", "rollback_error"):
            if result.get(key):
                click.echo(f"{key.replace('_', ' ')}: {result[key]}", err=True)
    if not SwitchResult.from_dict(result).ok:
        sys.exit(1)


@click.command()
@click.argument("models", nargs=-1, required=True, metavar="MODEL [MODEL...]")
@config_option
@click.option("--no-rollback", is_flag=True, help="leave a failed switch failed instead of rolling back")
@click.option("--force", is_flag=True, help="redeploy even if MODEL already serves, healthy and unchanged")
@click.option("--dry-run", is_flag=True, help="say what the switch would stop and whether it keeps the route up")
@local_option
@click.option(
    "--ignore-agent",
    is_flag=True,
    help="agentless (in-process, ssh transport): act even though the box's own agent is running",
)
@json_option
def switch(
    models: tuple[str, ...],
    config: str | None,
    no_rollback: bool,
    force: bool,
    dry_run: bool,
    local: bool,
    ignore_agent: bool,
    as_json: bool,
) -> None:
    """Switch the host of MODEL to MODEL: stage, stop, free GPUs, install, start, health-check.

    With the front proxy, several MODELs (disjoint GPUs) serve together, and a switch stops only
    the models on the GPUs it needs."""
    wanted = list(dict.fromkeys(models))
    be = backend(config, local=local, ignore_agent=ignore_agent)
    be.call(CHECK_TOGETHER, {"models": wanted})  # the rules of whoever switches, before anything stops
    if dry_run:
        plans = [be.call(EXPLAIN, {"model": m}) for m in wanted]
        if as_json:
            click.echo(json.dumps(plans, indent=2))
        for p in [] if as_json else plans:
            click.echo(f"{p['model']} on {p['host']}: {p['mode'].replace('_', '-')}: {p['reason']}")
        return
    if as_json and len(wanted) > 1:  # one JSON document: the list of results, in order
        return _switch_all_json(be, wanted, no_rollback, force)
    for model in wanted:

        def run(p: ProgressCallback, m: str = model) -> dict[str, Any]:
            return be.call(SWITCH, {"model": m, "no_rollback": no_rollback, "force": force}, p)

        _finish(with_progress(as_json, run), as_json)


def _switch_all_json(be: Any, models: list[str], no_rollback: bool, force: bool) -> None:
    """`switch A B --json`: each switch in turn until one does not end active, then one list of the
    results; an error after some of them carries those (``results`` beside the error document)."""
    results: list[dict[str, Any]] = []
    try:
        for model in models:
            results.append(be.call(SWITCH, {"model": model, "no_rollback": no_rollback, "force": force}))
            if not SwitchResult.from_dict(results[-1]).ok:
                break
    except OrchestratorError as exc:
        exc.partial = results  # printed with the error document (cli/__init__.py)
        raise
    click.echo(json.dumps(results, indent=2))
    if not all(SwitchResult.from_dict(r).ok for r in results):
        sys.exit(1)


@click.command()
@click.argument("model")
@config_option
@local_option
@json_option
def stop(model: str, config: str | None, local: bool, as_json: bool) -> None:
    """Stop MODEL and free its GPUs (with the proxy: its route goes first, the others keep serving)."""
    run_model_job(
        STOP,
        model,
        config,
        local,
        as_json,
        text=lambda r: (
            f"{r['model']} (revision {r['revision']}) on "
            f"{r['host']}: stopped; serving: {', '.join(r['serving']) or 'nothing'}"
        ),
    )


@click.command()
@config_option
@on_option("the host of deploy.toml to roll back (default: the only one)")
@click.option(
    "--to",
    "to_revision",
    type=int_in(1, 2**31 - 1),
    default=None,
    metavar="REVISION",
    help="redeploy this revision's exact unit (default: the previous stable one)",
)
@local_option
@click.option(
    "--ignore-agent",
    is_flag=True,
    help="agentless (in-process, ssh transport): act even though the box's own agent is running",
)
@json_option
def rollback(
    config: str | None, host: str | None, to_revision: int | None, local: bool, ignore_agent: bool, as_json: bool
) -> None:
    """Go back to the last model that was healthy, or to revision --to N."""
    be = backend(config, local=local, ignore_agent=ignore_agent)
    result = with_progress(as_json, lambda p: be.call(ROLLBACK, {"host": host, "to_revision": to_revision}, p))
    _finish(result, as_json)


@click.command()
@config_option
@on_option("the host of deploy.toml to recover (default: every one)")
@read_local_option
@json_option
def recover(config: str | None, host: str | None, local: bool, as_json: bool) -> None:
    """Finish deployments a crash or a stop left unfinished (the agent does this on start)."""
    be = backend(config, local=local)
    results = with_progress(as_json, lambda p: list(be.call(RECOVER, {"host": host}, p)["recovered"]))
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        for r in results:
            click.echo(f"revision {r['revision']} ({r['model']}) on {r['host']}: {r['outcome']}")
        if not results:
            click.echo("nothing to recover")


@click.command()
@config_option
@on_option("the host of deploy.toml to show (default: every one)")
@click.option("--group", "group", default=None, help="every box of this group, through its agent (one line each)")
@click.option("--follow", is_flag=True, help="stream the running operation's progress until it ends")
@read_local_option
@json_option
def status(config: str | None, host: str | None, group: str | None, follow: bool, local: bool, as_json: bool) -> None:
    """What serves on each host, what is running, and the schedules."""
    if group is not None:
        from orchestrator.cli.rollout_cmds import print_group_status

        return print_group_status(config, group, as_json)
    be = backend(config, local=local)
    if follow:
        with_progress(as_json, lambda p: be.call(FOLLOW, {"host": host}, p))
    result = be.call(STATUS, {"host": host})
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    print_status(stdout_console(), result)


def print_residency(console: Console, res: dict[str, Any]) -> None:
    """Warm switches: each model's residency, the RAM sleepers hold, each GPU's memory by process."""
    for m in res["models"]:
        level = (
            f" ({m['level']}" + (f", {m['ram_gib']:.2f} GiB of host RAM)" if m["ram_gib"] else ")")
            if m["state"] == "asleep"
            else ""
        )
        console.print(f"  {m['state']} {m['model']}{level}", markup=False, soft_wrap=True)
    budget = res.get("ram_budget_gib")
    console.print(
        f"  sleepers hold {res['sleep_ram_gib']:.2f} GiB of host RAM"
        + (f" (budget {budget:.1f} GiB)" if budget is not None else " (budget unknown)"),
        markup=False,
    )
    for g in res.get("gpus", []):
        procs = (
            ", ".join(
                f"PID {p['pid']} {p['model'] or '?'}{' ' + p['state'] if p['state'] else ''} {p['mib']} MiB"
                for p in g["processes"]
            )
            or "no process"
        )
        console.print(
            f"  GPU {g['index']}: {g['used_mib']} of {g['total_mib']} MiB used ({procs})", markup=False, soft_wrap=True
        )
    if "gpus_error" in res:
        console.print(f"  GPUs not probed: {res['gpus_error']}", markup=False, soft_wrap=True)


def print_demand(console: Console, demand: dict[str, Any]) -> None:
    """Models on demand: the requests held per model, the swap running, the swaps of the last minute."""
    queues = (
        ", ".join(
            f"{m} {q['waiting']} waiting (oldest {q['oldest_s']:.1f} s)"
            for m, q in sorted(demand.get("queues", {}).items())
        )
        or "no request held"
    )
    line = f"  on demand: {queues}; {demand.get('swaps_last_min', 0)} swaps in the last minute"
    if demand.get("swapping"):
        line += f"; bringing up {demand['swapping']}"
    if demand.get("yielding_to"):
        line += f"; waiting for {demand['yielding_to']}"
    console.print(line, markup=False, soft_wrap=True)


def print_status(console: Console, result: dict[str, Any]) -> None:
    """One line per fact; through a pipe each stays one line (grep finds it), on a terminal it wraps."""
    for name, entry in result["hosts"].items():
        serving = entry["serving"]
        if serving is None and entry.get("node_of"):
            for rank in entry["node_of"]:
                console.print(
                    f"[bold]{name}[/]: a node of {rank['model']} (revision {rank['revision']}, headed on "
                    f"{rank['head']}: {', '.join(rank['units'])})",
                    soft_wrap=True,
                )
        elif serving is None and entry.get("last"):
            last = entry["last"]
            why = f": {str(last['error']).splitlines()[0][:300]}" if last.get("error") else ""
            console.print(
                f"[bold]{name}[/]: nothing serves: revision {last['revision']} ({last['model']}) "
                f"ended {last['outcome']}" + escape(why),
                soft_wrap=True,
            )
        elif serving is None:
            console.print(f"[bold]{name}[/]: nothing known to serve")
        else:
            health = {True: "[green]healthy[/]", False: "[red]not healthy[/]"}.get(serving.get("healthy"), "")
            console.print(
                f"[bold]{name}[/]: {serving['model']} (revision {serving['revision']}, "
                f"{serving['unit']}, {serving['url']}) {health}"
            )
            for node in serving.get("nodes", []):
                restarts = f" (restarted {node['restarts']}x by systemd on its own)" if node.get("restarts") else ""
                console.print(
                    f"  node {node['host']}: {node['role']}, {node['unit']} {node['state']}{restarts}",
                    markup=False,
                    soft_wrap=True,
                )
        if "endpoint" in entry:
            console.print(f"  endpoint {entry['endpoint']}")
        for m in entry.get("models", []):
            health = {True: "[green]healthy[/]", False: "[red]not healthy[/]"}.get(m.get("healthy"), "")
            console.print(
                f"  serving {m['served_name']}: {m['model']} (revision {m['revision']}, GPU "
                f"{','.join(map(str, m['gpus']))}, {m['url']}) {health}"
            )
        if "residency" in entry:
            print_residency(console, entry["residency"])
        demand = ((result.get("agent") or {}).get("demand") or {}).get("hosts", {}).get(name)
        if demand is not None:
            print_demand(console, demand)
        for run in entry["running"]:
            state = "interrupted" if entry.get("interrupted") else "running"
            console.print(
                f"  {state}: #{run['id']} revision {run['revision']} {run['model']} "
                f"in phase {run['phase']} ({run['trigger']})"
                + (
                    "; nothing runs it now: `orchestrator recover` finishes it (so does the next "
                    "switch, or the agent when it starts)"
                    if entry.get("interrupted")
                    else ""
                ),
                soft_wrap=True,
            )
    for sched in result.get("schedules", []):
        console.print(
            f"schedule {sched['name']}: {sched['action']} {sched.get('model') or ''} "
            + (f"next at {sched['next_run']}" if sched["next_run"] else "no next run (it has ended)")
        )


@click.command()
@config_option
@on_option("the host of deploy.toml whose history is shown (default: every one)")
@click.option("--group", "group", default=None, help="every box of this group, newest first across them")
@click.option("--limit", type=int_in(1, 10_000), default=20, show_default=True)
@read_local_option
@json_option
def history(config: str | None, host: str | None, group: str | None, limit: int, local: bool, as_json: bool) -> None:
    """Revisions, newest first: model, unit hash, trigger, outcome and the time of every phase."""
    if group is not None:
        from orchestrator.cli.rollout_cmds import print_group_history

        return print_group_history(config, group, limit, as_json)
    rows = backend(config, local=local).call(HISTORY, {"host": host, "limit": limit})
    if printed(rows, as_json, empty=lambda: f"no deployments recorded yet on {_where(config, host)}"):
        return
    table_rows: list[list[str | Text]] = []
    for r in rows:
        # Rows come from a database that may predate or postdate this version: any field may be missing.
        created, ended = _number(r.get("created_at")), _number(r.get("ended_at"))
        took = f"{ended - created:.1f}s" if ended is not None and created is not None else "-"
        phases = " ".join(
            f"{text_of(str(p.get('phase'))).short} {seconds:.1f}"
            for p in r.get("phases") or []
            if (seconds := _number(p.get("seconds"))) is not None
        )
        plan = r.get("plan")
        if isinstance(plan, dict) and plan.get("mode") == "beside":
            phases = f"beside, no gap: {phases}"  # the target started or woke beside the old model
        demand = r.get("demand")
        if isinstance(demand, dict) and (worst := _number(demand.get("wait_max_s"))) is not None:
            phases += f" | {demand.get('requests')} held, waited up to {worst:.1f}"  # models on demand
        quiet = r.get("quiet")
        if isinstance(quiet, dict) and (waited := _number(quiet.get("seconds"))) is not None:
            left = f", {quiet.get('in_flight')} still in flight" if quiet.get("outcome") == "bound" else ""
            phases += f" | route waited {waited:.2f} for quiet{left}"  # warm: before the gap, the old model serving
        bench = r.get("bench") or {}
        headline = _number(bench.get("headline_tok_s")) if isinstance(bench, dict) else None
        outcome = outcome_text(str(r.get("outcome", "?")))
        table_rows.append(
            [
                str(r.get("host", "?")),
                str(r.get("revision", "?")),
                str(r.get("model", "?")),
                str(r.get("unit_sha256") or "")[:12],
                str(r.get("trigger") or ""),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if created else "-",
                Text(outcome, style=text_of(str(r.get("outcome", "?"))).style),
                took,
                phases,
                f"{headline:.1f}" if headline else "",
            ]
        )
    print_table(
        stdout_console(),
        ["host", "rev", "model", "unit sha", "trigger", "started", "outcome", "took", "phases (s)", "tok/s C=1"],
        table_rows,
    )


def outcome_text(outcome: str) -> str:
    """A history row's outcome; a deployment still in a phase says it is unfinished (running, or
    interrupted: `status` tells which), so a phase is never read as how it ended."""
    try:
        phase = Phase(outcome)
    except ValueError:
        return outcome  # stopped, or a word from a newer version
    return outcome if is_terminal(phase) else f"{outcome} (unfinished)"


def _where(config: str | None, host: str | None) -> str:
    """The hosts an empty history speaks of: --host's box has its own catalog, ours names them."""
    if host is not None:
        return f"host {host}"
    if remote_spec() is not None:
        return str(remote_spec())
    from orchestrator import settings

    peeked = settings.peek(config)  # only names for a message: the rows came from whoever answered
    names = list(peeked.hosts) if peeked is not None and peeked.hosts else sorted(settings.load(config).hosts)
    return f"host {names[0]}" if len(names) == 1 else f"hosts {', '.join(names)}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
