"""`rollout MODEL`, `rollout status | resume | abort`, and `status/history --group G`: the controller's
fleet commands (they read the controller's deploy.toml and reach each box's agent over SSH)."""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestrator import settings
from orchestrator.cli.options import MAX_HOSTS, MAX_ID, config_option, int_in, json_option
from orchestrator.cli.target import backend, remote_spec
from orchestrator.client.backends import AgentClient
from orchestrator.contract.ops import (
    PING,
    ROLLOUT_ABORT,
    ROLLOUT_FOLLOW,
    ROLLOUT_RESUME,
    ROLLOUT_START,
    ROLLOUT_STATUS,
)
from orchestrator.contract.wire import socket_path
from orchestrator.core.rollout import RolloutStatus
from orchestrator.errors import AgentError, Detached, TransportError, UsageError

if TYPE_CHECKING:  # an in-CLI rollout loads the fleet (and the catalog); a client of the controller does not
    from orchestrator.rollout.fleet import AfterBatch, Fleet

# Set only by code that embeds the CLI (the tests' entry point holds the controller between batches
# with it); no flag or environment variable reaches it.
after_batch_hook: AfterBatch | None = None

_STYLE = {
    "switched": "green",
    "failed": "red",
    "reverted": "yellow",
    "switching": "cyan",
    "staging": "cyan",
    "reverting": "yellow",
}


class FleetProgress:
    """Per-host progress: a Live table on a terminal, one plain line per change otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.rows: dict[str, dict[str, Any]] = {}
        self.t0 = time.monotonic()
        self.live: Live | None = None
        if not quiet and self.console.is_terminal:
            self.live = Live(self._table(), console=self.console, refresh_per_second=8, transient=False)
            self.live.start()

    def close(self) -> None:
        if self.live is not None:
            self.live.update(self._table())
            self.live.stop()
            self.live = None

    def __call__(self, host: str, event: str, fields: dict[str, Any]) -> None:
        if event == "rollout_paused":  # the whole rollout waits for a lost box: no row of its own
            if not self.quiet:
                self.console.print(
                    f"{time.monotonic() - self.t0:7.1f}s {fields.get('reason', 'paused')} "
                    f"(the controller tries again every {fields.get('retry_s', '?')} s)",
                    markup=False,
                )
            return
        row = self.rows.setdefault(host, {"batch": "", "state": "pending", "phase": "", "detail": ""})
        line: str | None = None
        if event == "rollout_host":
            for key in ("batch", "state"):
                if fields.get(key) is not None:
                    row[key] = fields[key]
            detail = fields.get("error") or fields.get("detail") or fields.get("outcome") or fields.get("serving")
            row["detail"] = str(detail or "")
            line = f"{host}: {row['state']}" + (f" ({row['detail']})" if row["detail"] else "")
        elif event == "phase":
            row["phase"] = str(fields.get("phase", ""))
            line = f"{host}: #{fields.get('revision', '?')} {fields.get('model', '')} {row['phase']}"
        elif event == "stage_progress":
            done, total = int(fields.get("bytes", 0)), int(fields.get("total", 0) or 0)
            row["phase"] = f"staging {100 * done / total:.0f}%" if total else "staging"
        if self.quiet:
            return
        if self.live is not None:
            self.live.update(self._table())
        elif line is not None:
            self.console.print(f"{time.monotonic() - self.t0:7.1f}s {line}")

    def _table(self) -> Table:
        table = Table("host", "batch", "state", "phase", "detail", title="rollout")
        for host, row in self.rows.items():
            style = _STYLE.get(str(row["state"]), "")
            state = f"[{style}]{row['state']}[/]" if style else str(row["state"])
            table.add_row(host, str(row["batch"]), state, str(row["phase"]), str(row["detail"]))
        return table


def _fleet(
    config: str | None,
    command: str,
    report: FleetProgress | None = None,
    *,
    on_start: Callable[[int], None] | None = None,
    reading: bool = False,
) -> Fleet:
    """``reading``: for a read-only command (rollout status, status --group): rollouts.db opens read-only."""
    spec = remote_spec()
    if spec is not None:
        raise UsageError(
            f"{command} runs on the controller and reaches every box's agent itself; drop "
            f"--host {spec} (the hosts come from the controller's deploy.toml)"
        )
    from orchestrator.rollout.fleet import Fleet
    from orchestrator.rollout.store import RolloutStore

    cat = settings.load(config)
    store = RolloutStore(Path(cat.state_dir) / "rollouts.db", group=cat.socket_group, reading=True) if reading else None
    fleet = Fleet(
        cat,
        report=report,
        after_batch=after_batch_hook,
        on_start=on_start,
        store=store,
        started_by=f"{getpass.getuser()}@{socket.gethostname()} (this CLI)",
    )
    click.get_current_context().call_on_close(fleet.close)
    return fleet


def _controller(config: str | None) -> AgentClient | None:
    """The agent that runs the fleet's rollouts: --host CTL, else an agent running with this
    deploy.toml (its socket answers); None: no controller, the rollout runs in this CLI."""
    if remote_spec() is not None:
        client = backend(config)
        assert isinstance(client, AgentClient)
        return client
    # The socket from deploy.toml read as TOML only (as `status` finds it): the controller checks the
    # request against its own catalog; a file peek cannot read plainly is loaded (and refused, exit 2).
    peeked = settings.peek(config)
    path = socket_path(peeked.state_dir if peeked is not None else settings.load(config).state_dir)
    if not os.path.exists(path):
        return None
    local = AgentClient(path)
    try:
        local.call(PING, {})
    except AgentError as exc:
        if "permission denied" in str(exc) or "may not use the agent" in str(exc):
            raise
        return None  # a stale socket: nothing answers there
    return local


def _no_controller_note(rid: int) -> None:
    click.echo(
        f"note: rollout #{rid} runs in this CLI (no controller: give --host CTL, or run the agent with "
        "this deploy.toml); if this CLI stops, `orchestrator rollout resume` finishes it",
        err=True,
    )


def _run(
    config: str | None,
    command: str,
    as_json: bool,
    call: Callable[[Fleet], dict[str, Any]],
    on_start: Callable[[int], None] | None = None,
) -> None:
    progress = FleetProgress(quiet=as_json)
    try:
        result = call(_fleet(config, command, progress, on_start=on_start))
    finally:
        progress.close()
    _print(result, as_json)
    if result["rollout"]["status"] not in (RolloutStatus.SUCCEEDED.value, RolloutStatus.RUNNING.value):
        sys.exit(1)


def _follow(client: AgentClient, rid: int, as_json: bool) -> None:
    """Stream a controller's rollout to its end; Ctrl-C or a lost connection detach (it goes on there)."""
    progress = FleetProgress(quiet=as_json)
    again = f"`orchestrator {client.follow_hint}rollout status --follow --id {rid}` re-attaches"
    try:
        result = client.call(
            ROLLOUT_FOLLOW,
            {"id": rid},
            lambda event, fields: progress(str(fields.pop("group_host", "")), event, fields),
        )
    except (KeyboardInterrupt, Detached):  # the client turns Ctrl-C into Detached; either way: ours
        raise Detached(f"detached from rollout #{rid}: it goes on on the controller; {again}") from None
    except (AgentError, TransportError) as exc:
        lost = type(exc)(
            f"lost the controller while following rollout #{rid} ({str(exc).splitlines()[0]}); the "
            f"rollout is the controller's and goes on there (or resumes when its agent restarts); "
            f"{again}"
        )
        lost.exit_code = exc.exit_code
        raise lost from None
    finally:
        progress.close()
    _print(result, as_json)
    if result["rollout"]["status"] not in (RolloutStatus.SUCCEEDED.value, RolloutStatus.RUNNING.value):
        sys.exit(1)


def _started(client: AgentClient, answer: dict[str, Any], as_json: bool) -> None:
    ro = answer["rollout"]
    if not as_json:
        click.echo(
            f"rollout #{answer['id']} {ro['model']} on group {ro['group']}: run by the controller "
            f"(agent pid {ro['controller']['pid']}), started by {ro.get('started_by') or 'unknown'}; "
            "Ctrl-C detaches",
            err=True,
        )
    _follow(client, int(answer["id"]), as_json)


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    ro = result["rollout"]
    why = f": {ro['reason']}" if ro.get("reason") else ""
    who = f" (started by {ro['started_by']})" if ro.get("started_by") else ""
    asked = (
        " (abort requested)"
        if ro.get("abort_requested") and ro["status"] in ("running", "paused", "interrupted")
        else ""
    )
    click.echo(f"rollout #{ro['id']} {ro['model']} on group {ro['group']}{who}: {ro['status']}{asked}{why}")
    for h in result["hosts"]:
        extra = " ".join(
            x
            for x in (
                f"deployment #{h['deployment_id']}" if h["deployment_id"] else "",
                h["outcome"] or "",
                h["error"] or "",
            )
            if x
        )
        click.echo(f"  {h['host']:<12} batch {h['batch']}  {h['state']:<9} {extra}")
    if result.get("message"):
        click.echo(result["message"])


class _RolloutGroup(click.Group):
    """`rollout MODEL ...` is `rollout start MODEL ...`; status, resume and abort are subcommands."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["start", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_RolloutGroup)
def rollout() -> None:
    """Switch a group model on every box of its group: canary first, then in batches (see `rollout start`)."""


@rollout.command("start")
@click.argument("model")
@config_option
@click.option("--group", "group", default=None, help="the group to roll out to (default: the model's group)")
@click.option("--canary", type=int_in(0, MAX_HOSTS), default=None, help="hosts switched first, alone")
@click.option("--batch", type=int_in(1, MAX_HOSTS), default=None, help="hosts switched at a time after the canary")
@click.option("--max-failures", type=int_in(0, MAX_HOSTS), default=None, help="failed hosts tolerated")
@click.option("--rollback-all", is_flag=True, help="when the rollout stops, return the switched hosts too")
@json_option
def start(
    model: str,
    config: str | None,
    group: str | None,
    canary: int | None,
    batch: int | None,
    max_failures: int | None,
    rollback_all: bool,
    as_json: bool,
) -> None:
    """Stage MODEL on every host (one hub download), then switch canary and batches through each agent.
    With a controller (--host CTL, or the agent of this deploy.toml) the rollout is its job."""
    client = _controller(config)
    if client is not None:
        args = {
            "model": model,
            "group": group,
            "canary": canary,
            "batch": batch,
            "max_failures": max_failures,
            "rollback_all": rollback_all,
        }
        _started(client, client.call(ROLLOUT_START, args), as_json)
        return
    _run(
        config,
        "rollout",
        as_json,
        lambda f: f.rollout(
            model, group=group, canary=canary, batch=batch, max_failures=max_failures, rollback_all=rollback_all
        ),
        on_start=_no_controller_note,
    )


@rollout.command("resume")
@config_option
@click.option("--id", "rid", type=int_in(1, MAX_ID), default=None, help="which rollout (default: the unfinished one)")
@json_option
def resume(config: str | None, rid: int | None, as_json: bool) -> None:
    """Finish a rollout whose controller died: hosts that already ended are never switched twice."""
    client = _controller(config)
    if client is not None:
        _started(client, client.call(ROLLOUT_RESUME, {"id": rid}), as_json)
        return
    _run(config, "rollout resume", as_json, lambda f: f.resume(rid))


@rollout.command("abort")
@config_option
@click.option("--id", "rid", type=int_in(1, MAX_ID), default=None, help="which rollout (default: the unfinished one)")
@click.option("--rollback-all", is_flag=True, help="also return the hosts it switched to the previous model")
@json_option
def abort(config: str | None, rid: int | None, rollback_all: bool, as_json: bool) -> None:
    """Start no further batch (a running controller stops after its batch); --rollback-all reverts."""
    client = _controller(config)
    if client is not None:
        _print(client.call(ROLLOUT_ABORT, {"id": rid, "rollback_all": rollback_all}), as_json)
        return
    _run(config, "rollout abort", as_json, lambda f: f.abort(rid, rollback_all=rollback_all))


@rollout.command("status")
@config_option
@click.option("--id", "rid", type=int_in(1, MAX_ID), default=None, help="which rollout (default: the latest)")
@click.option("--follow", is_flag=True, help="re-attach: stream the controller's rollout to its end")
@json_option
def rollout_status(config: str | None, rid: int | None, follow: bool, as_json: bool) -> None:
    """The recorded rollout: each host's batch, state, deployment id and outcome (no box is contacted)."""
    client = _controller(config)
    if client is not None:
        if follow:
            shown = client.call(ROLLOUT_STATUS, {"id": rid})
            _follow(client, int(shown["rollout"]["id"]), as_json)
            return
        _print(client.call(ROLLOUT_STATUS, {"id": rid}), as_json)
        return
    if follow:
        raise UsageError(
            "rollout status --follow re-attaches to a controller's rollout: give --host CTL (or run "
            "the agent with this deploy.toml); an in-CLI rollout is followed where it runs"
        )
    _print(_fleet(config, "rollout status", reading=True).summary(rid), as_json)


def group_clients(config: str | None, group: str, command: str) -> dict[str, Any]:
    fleet = _fleet(config, command, reading=True)
    if group not in fleet.catalog.groups:
        known = ", ".join(sorted(fleet.catalog.groups)) or "none"
        raise UsageError(f"unknown group {group!r} (known: {known})")
    return fleet._clients(list(fleet.catalog.groups[group].hosts))


def print_group_status(config: str | None, group: str, as_json: bool) -> None:
    from orchestrator.rollout.group_view import group_status

    result = group_status(group_clients(config, group, "status --group"))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for host, row in result["hosts"].items():
        if "error" in row:
            click.echo(f"{host:<12} unreachable: {row['error']}")
            continue
        s = row["serving"]
        health = "" if s is None else {True: "healthy", False: "NOT healthy"}.get(s.get("healthy"), "")
        what = "nothing" if s is None else f"{s['model']}@{row['weights_revision']} (box revision {s['revision']})"
        running = "".join(f"  running #{r['id']} {r['model']} {r['phase']}" for r in row["running"])
        click.echo(f"{host:<12} {what} {health}{running}")
    for key, hosts in result["revisions"].items():
        click.echo(f"{key}: {', '.join(hosts)}")


def print_group_history(config: str | None, group: str, limit: int, as_json: bool) -> None:
    from orchestrator.rollout.group_view import group_history

    rows = group_history(group_clients(config, group, "history --group"), limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for line in group_history_lines(rows):
        click.echo(line)


def group_history_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per deployment, newest first; an unreachable host says why."""
    lines = []
    for r in rows:
        if r.get("unreachable"):
            lines.append(f"{r['group_host']:<12} unreachable: {r['error']}")
            continue
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"]))
        lines.append(
            f"{at} {r['group_host']:<12} #{r['revision']:<3} {r['model']:<16} {r['outcome']:<11} "
            f"{r['trigger']}" + (f"  error: {r['error']}" if r.get("error") else "")
        )
    return lines
