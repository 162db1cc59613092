"""`adopt`: take over the engines a box already runs by hand (units, processes outside systemd)."""

from __future__ import annotations

import json
from typing import Any

import click

from orchestrator.cli.options import config_option, json_option, local_option, on_option
from orchestrator.cli.target import backend
from orchestrator.client.backends import AgentClient, Backend
from orchestrator.contract.ops import ADOPT, ADOPT_RECORD, CONFIG_PUSH, CONFIG_SHOW
from orchestrator.engines import ENGINES
from orchestrator.errors import AdoptError

# How each engine's API server is started, for the help (the engine's own words).
_FORMS = "; ".join(f"{e.title}'s {e.command_line.forms}" for e in ENGINES.values())


@click.command(
    help=f"""Find engines the box runs by hand and write their deploy.toml entries (--apply: take them over).

    Every unit whose command runs an engine's API server ({_FORMS}) and every such process started outside
    systemd, or the UNITs named. Each gets a model entry (layout, served name, port, GPUs from
    CUDA_VISIBLE_DEVICES, the other flags verbatim in args; secrets stay in their files) printed as TOML for
    review, with what it cannot carry named. --apply adds the entries to deploy.toml and records a revision
    of what runs now (trigger adopt): the first switch away can be rolled back to it; a hand-run process
    is stopped by that switch.
    """
)
@click.argument("units", nargs=-1, metavar="[UNIT...]")
@config_option
@on_option("the host of deploy.toml to look at (default: the only one)")
@click.option(
    "--apply",
    "apply",
    is_flag=True,
    help="push the entries into deploy.toml (checked as `config push` checks) and record what runs now",
)
@local_option
@json_option
def adopt(
    units: tuple[str, ...], config: str | None, host: str | None, apply: bool, local: bool, as_json: bool
) -> None:
    """Find engines the box runs by hand and write their deploy.toml entries (the help is above)."""
    be = backend(config, local=local)
    found = be.call(ADOPT, {"host": host, "units": list(units)})
    if not apply:
        click.echo(json.dumps(found, indent=2) if as_json else _review(found))
        return
    blocked = [f"{_label(x)}: {b}" for x in found["adopted"] for b in x["blockers"]]
    if blocked:
        raise AdoptError("nothing was changed: " + "; ".join(blocked))
    if not found["adopted"]:
        click.echo(
            json.dumps(found | {"recorded": []}, indent=2)
            if as_json
            else f"host {found['host']}: no engine runs outside the product; nothing to adopt"
        )
        return
    pushed = _push(be, config, local, found["toml"]) if found["toml"] else None  # entries deploy.toml lacks
    ask = {
        "host": host,
        "units": [x["unit"] for x in found["adopted"] if x["unit"]],
        "pids": [x["pid"] for x in found["adopted"] if x["pid"] is not None],
    }
    recorded = _after_push(be, config, local).call(ADOPT_RECORD, ask)
    if as_json:
        extra = {"proxy": recorded["proxy"]} if "proxy" in recorded else {}
        click.echo(json.dumps(found | {"config": pushed, "recorded": recorded["recorded"]} | extra, indent=2))
        return
    click.echo(_review(found))
    added = len([x for x in found["adopted"] if not x["in_config"]])
    if pushed is not None:
        click.echo(
            f"{pushed['path']}: config revision {pushed['revision']}: {added} entr{'y' if added == 1 else 'ies'} added"
        )
    for r in recorded["recorded"]:
        what = f"unit {r['unit']}" if r["pid"] is None else f"pid {r['pid']} (its next switch stops it)"
        click.echo(
            f"host {recorded['host']}: revision {r['revision']} records {r['model']} as it runs now "
            f"({what}); `orchestrator switch` away from it can be rolled back to it"
        )
    if "proxy" in recorded:
        click.echo(f"front proxy on {recorded['host']}: {recorded['proxy']}", err=recorded["proxy"].startswith("not"))


def _label(x: dict[str, Any]) -> str:
    return f"unit {x['unit']}" if x["unit"] else f"pid {x['pid']}"


def _review(found: dict[str, Any]) -> str:
    if not found["adopted"]:
        return f"# host {found['host']}: no engine runs outside the product; nothing to adopt"
    lines = []
    for x in found["adopted"]:
        if x["in_config"]:
            lines.append(f"# {_label(x)} runs model {x['name']} of deploy.toml (its entry describes it)")
            lines += [f"# note: {n}" for n in x["notes"]]
        else:
            lines.append(x["toml"].rstrip("\n"))
        for d in x["differences"]:
            lines.append(f"# differs when rendered: {d}")
        if not x["differences"] and "rendered_argv" in x:
            made = " ".join(x["explicit"])
            lines.append(
                "# its unit would run the same command" + (f" (stating the engine's defaults {made})" if made else "")
            )
        lines.append("")
    return "\n".join(lines)


def _push(be: Backend, config: str | None, local: bool, toml: str) -> dict[str, Any]:
    """deploy.toml with the entries appended, through config push's checks: the agent's, or in-process the
    same validation on this file (agent/config_ops.py), its revision recorded."""
    if isinstance(be, AgentClient):
        text = be.call(CONFIG_SHOW, {})["text"]
        result: dict[str, Any] = be.call(CONFIG_PUSH, {"text": _joined(text, toml), "name": "adopt"})
        return result
    import time

    from orchestrator import settings
    from orchestrator.agent.config_ops import ConfigRevisions
    from orchestrator.deploy.planning import default_trigger

    path = settings.config_path(config)
    running = settings.load(path)
    revisions = ConfigRevisions(path, running.state_dir, group=running.socket_group)
    previous, text = revisions.current()
    new = _joined(text, toml)
    revisions.validate(new, str(path), running, now=time.time())
    if previous is None:
        revisions.record_if_new(default_trigger())  # the file as it was, so the change has a revision to diff from
    return {"path": str(path), "revision": revisions.replace(new, default_trigger()), "previous_revision": previous}


def _after_push(be: Backend, config: str | None, local: bool) -> Backend:
    """Who records: the agent (it reloaded the pushed file), or in-process the file as it is now."""
    return be if isinstance(be, AgentClient) else backend(config, local=True)  # the file as pushed


def _joined(text: str, toml: str) -> str:
    return (text if text.endswith("\n") or not text else text + "\n") + toml
