"""`models` and `render`: the catalog and the units it produces."""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from orchestrator import settings, userfiles
from orchestrator.cli.options import config_option, json_option, nonempty
from orchestrator.cli.tables import print_table
from orchestrator.cli.target import catalog, local_only
from orchestrator.core.catalog import Catalog, Model
from orchestrator.core.multinode import render_nodes
from orchestrator.core.render import RenderedUnit, load_deadline, render_agent_unit, render_unit
from orchestrator.deploy.planning import default_template, template_for
from orchestrator.errors import UsageError
from orchestrator.resources import template_text


def _templates(model: Model, own: str) -> Callable[[str], str]:
    """A multi-node model's templates by name: ``own`` for its engine's, the shipped ones for the rest."""
    return lambda name: own if name == model.engine.template else template_text(name)


@click.command()
@config_option
@json_option
def models(config: str | None, as_json: bool) -> None:
    """List the models of the catalog (with --host: of the box's deploy.toml)."""
    cat = catalog(config)
    rows: list[dict[str, Any]] = []
    for name, m in cat.models.items():
        where = f"group:{m.group}" if m.group else cat.model_host(name).name
        rows.append(
            {
                "name": name,
                "host": where,
                "repo": m.repo,
                "revision": m.revision,
                "pinned": m.pinned,
                "served_name": m.served,
                "port": m.port,
                "gpus": list(m.gpus),
                "tensor_parallel": m.tensor_parallel,
                "pipeline_parallel": m.pipeline_parallel,
                "data_parallel": m.data_parallel,
                "expert_parallel": m.expert_parallel,
                "max_model_len": m.max_model_len,
                "load_deadline_s": load_deadline(cat, m),
                "unit": m.unit_name,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table_rows: list[list[str]] = []
    for r in rows:
        layout = (
            f"TP={r['tensor_parallel']}"
            + (f" PP={r['pipeline_parallel']}" if r["pipeline_parallel"] > 1 else "")
            + (f" DP={r['data_parallel']}" if r["data_parallel"] > 1 else "")
            + (" + EP" if r["expert_parallel"] else "")
        )
        rev = r["revision"] if r["pinned"] else f"{r['revision']} (unpinned)"
        table_rows.append(
            [
                r["name"],
                r["host"],
                f"{r['repo']}@{rev}",
                r["served_name"],
                str(r["port"]),
                ",".join(map(str, r["gpus"])),
                layout,
                f"{r['load_deadline_s']:g} s",
            ]
        )
    if not table_rows:
        click.echo(f"no models in {settings.config_path(config)}")
        return
    print_table(
        Console(), ["model", "host", "repo@revision", "served as", "port", "GPUs", "layout", "deadline"], table_rows
    )


@click.command()
@click.argument("model", required=False)
@config_option
@click.option(
    "--out",
    "out",
    default="units",
    metavar="DIR",
    callback=nonempty,
    show_default=True,
    help="directory the rendered units are written to",
)
@click.option(
    "--diff",
    "diff",
    is_flag=True,
    help="show what would change against the units in --out (writes nothing; exit 1 if any)",
)
@click.option(
    "--template",
    "template",
    metavar="PATH",
    callback=nonempty,
    default=None,
    help="the default engine's unit template to render from",
)
@click.option("--agent", "agent", is_flag=True, help="also render orchestrator-agent.service for this config")
@click.option("--installed", is_flag=True, help="with --diff: compare with the unit installed on the model's host")
@click.option(
    "--proxy",
    "proxy",
    is_flag=True,
    help="print each host's front proxy config (haproxy.cfg) routing what serves there now; with "
    "--diff: against the one installed at proxy.config_path (exit 1 if they differ)",
)
def render(
    model: str | None,
    config: str | None,
    out: str,
    diff: bool,
    template: str | None,
    agent: bool,
    installed: bool,
    proxy: bool,
) -> None:
    """Render each model's unit into units/ (all models when MODEL is omitted)."""
    if proxy:
        local_only("render --proxy")  # what serves is read from this machine's state.db
        if model is not None:
            raise UsageError(f"render --proxy renders a whole host's config: drop the MODEL argument ({model})")
        return _render_proxy(settings.load(config), diff)
    if installed:
        local_only("render --diff --installed")
    if agent:
        local_only("render --agent")  # the unit names this machine's python and config path
    cat = catalog(config)
    if model is not None:
        cat.model(model)
    text = _template(template) if template else default_template()
    out_dir = Path(out)
    if not diff and out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    names = [model] if model else list(cat.models)
    rendered: list[RenderedUnit] = []
    unit_host: dict[str, str] = {}
    for n in names:  # all or nothing: render before writing
        m = cat.models[n]
        own = template_for(m, text)
        if m.nodes:  # every role of a multi-node model: one unit per node, the Ray head's too
            multi = render_nodes(cat, m, _templates(m, own))
            rendered.append(multi.api)
            rendered += [RenderedUnit(node.unit_name, node.unit_text) for node in multi.nodes]
            unit_host |= {node.unit_name: node.host for node in multi.nodes}
        else:
            rendered.append(render_unit(cat, m, own))
        unit_host[m.unit_name] = cat.model_host(n).name
    if agent:
        rendered.append(
            render_agent_unit(
                cat,
                template_text("orchestrator-agent.service.j2"),
                python=sys.executable,
                config=str(settings.config_path(config).resolve()),
            )
        )
    changed = 0
    ports_for = None
    if installed:
        from orchestrator.wiring import ports_factory

        ports_for = ports_factory(cat)
    for unit in rendered:
        path = out_dir / unit.name
        if ports_for is not None and unit.name != "orchestrator-agent.service":
            host = cat.hosts[unit_host[unit.name]]
            old = ports_for(host.name).systemd.read_unit(unit.name) or ""
            path = Path(f"{host.name}:{host.unit_dir}") / unit.name
        else:
            old = userfiles.read_text(path) if path.exists() else ""
        if diff:
            lines = list(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    unit.text.splitlines(keepends=True),
                    fromfile=str(path) if old else "/dev/null",
                    tofile=f"{path} (rendered)",
                )
            )
            changed += bool(lines)
            sys.stdout.writelines(lines)
            continue
        _write(out_dir, path, unit.text)
        click.echo(f"{path}  sha256 {unit.sha256[:12]}" + ("" if old != unit.text else "  (unchanged)"))
    if diff and changed:
        sys.exit(1)


def _template(path: str) -> str:
    try:
        return userfiles.read_text(path)
    except FileNotFoundError:
        raise UsageError(f"--template {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--template {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UsageError(f"--template {path}: cannot read: {exc.strerror}") from None


def _write(out_dir: Path, path: Path, text: str) -> None:
    """Write one unit atomically (an unguessable temporary renamed over it: no planted symlink is followed)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        userfiles.write_atomic(path, text.encode())
    except OSError as exc:
        raise UsageError(f"--out {out_dir}: cannot write {path.name}: {exc.strerror}") from None


def _render_proxy(cat: Catalog, diff: bool) -> None:
    """The haproxy.cfg the engine writes for what serves on each host now (the state store's serving
    set: the routes of the last switch or stop); with ``diff``, against the installed one."""
    from orchestrator.adapters import connect
    from orchestrator.adapters.local_shell import LocalShell
    from orchestrator.adapters.sqlite_store import SqliteStore
    from orchestrator.core.proxy import DEMAND_LUA, render_host, routes_for

    if not cat.proxy.enabled:
        raise UsageError("render --proxy: the front proxy is not enabled in deploy.toml (set [proxy] enabled = true)")
    db = Path(cat.state_dir) / "state.db"
    store = SqliteStore(db, group=cat.socket_group, reading=True)  # read-only: nothing made or chmod-ed
    changed = False
    for name, host in cat.hosts.items():
        specs = [d.spec for d in store.serving_set(name)]
        bind = cat.proxy.bind or host.bind or cat.defaults.bind
        text = render_host(
            cat, name, bind, routes_for(specs), template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA)
        )
        where = f"{name}:{cat.proxy.config_path}"
        if not diff:
            click.echo(f"# host {where}: routes {', '.join(s.served_name for s in specs) or 'none'}")
            click.echo(text, nl=False)
            continue
        # Only the file is read: a local host needs no D-Bus for that, a remote one its SSH connection.
        shell = (
            LocalShell(name)
            if host.transport == "local"
            else connect(
                host.transport,
                host.address,
                port=host.ssh_port,
                user=host.ssh_user,
                key_filename=host.ssh_key,
                known_hosts=host.known_hosts,
                unit_dir=host.unit_dir,
                host=name,
            )[0]
        )
        try:
            raw = shell.read_file(cat.proxy.config_path)
        finally:
            shell.close()
        old = "" if raw is None else raw.decode("utf-8", "replace")
        lines = list(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=where if raw is not None else "/dev/null",
                tofile=f"{where} (rendered)",
            )
        )
        changed |= bool(lines)
        sys.stdout.writelines(lines)
    if changed:
        sys.exit(1)
