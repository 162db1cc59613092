"""MkDocs hook: the reference pages' generated parts, read from the code at build time.

A page holds a marker line such as ``<!-- generated: cli -->``; ``on_page_markdown`` replaces it with
markdown built from the code: the CLI from its click command tree, every deploy.toml key from the
pydantic models, the exit codes from ``orchestrator.errors``, the agent's metrics and the switch's
state table. Nothing is written to the tree; an unknown marker, or a deploy.toml key with no meaning
(neither in docs/reference/deploy-keys.toml nor in a comment beside its field), fails the build.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import tomllib
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import click
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

DOCS = Path(__file__).resolve().parent
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_path}: unknown generated section {name!r} (known: {sorted(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("``", "`").replace("|", "\\|")


# --- the CLI -------------------------------------------------------------------------------------------


def cli() -> str:
    from orchestrator.cli import main

    out: list[str] = []
    root = click.Context(main, info_name="orchestrator")
    _command(main, root, out, level=2)
    return "\n".join(out)


def _command(cmd: click.Command, ctx: click.Context, out: list[str], level: int) -> None:
    path = ctx.command_path
    out += [f"{'#' * level} `{path}`", ""]
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    out += ["```", f"{path} {usage}".rstrip(), "```", ""]
    if cmd.help:
        out += [inspect.cleandoc(cmd.help).replace("\b\n", ""), ""]
    rows: list[tuple[str, str]] = []
    for param in cmd.get_params(ctx):
        if isinstance(param, click.Argument):
            rows.append(
                (
                    f"`{param.make_metavar(ctx) if _metavar_takes_ctx() else param.make_metavar()}`",
                    "argument" + (" (required)" if param.required else ""),
                )
            )
        elif isinstance(param, click.Option) and not param.hidden and param.name != "help":
            record = param.get_help_record(ctx)
            if record:
                rows.append((f"`{record[0]}`", record[1]))
    if rows:
        out += ["| option | meaning |", "|---|---|"]
        out += [f"| {_cell(a)} | {_cell(b)} |" for a, b in rows]
        out.append("")
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            _command(sub, click.Context(sub, info_name=name, parent=ctx), out, level=min(level + 1, 4))


def _metavar_takes_ctx() -> bool:
    return "ctx" in inspect.signature(click.Argument.make_metavar).parameters


# --- deploy.toml ----------------------------------------------------------------------------------------


def config_keys() -> str:
    from orchestrator.core.catalog import Catalog

    meanings = tomllib.loads((DOCS / "reference" / "deploy-keys.toml").read_text())["keys"]
    sections: list[tuple[str, type[BaseModel]]] = [("", Catalog)]
    out: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    while sections:
        prefix, model = sections.pop(0)
        comments = _field_comments(model)
        rows: list[str] = []
        for name, field in model.model_fields.items():
            if name == "name" and prefix:  # copied from the table's key
                continue
            key = f"{prefix}.{name}" if prefix else name
            table = _table_of(field.annotation)
            if table is not None:
                named = get_origin(_bare(field.annotation)) is dict
                sections.append((key + (".NAME" if named else ""), table))
                continue
            seen.add(key)
            meaning = meanings.get(key) or comments.get(name)
            if not meaning:
                missing.append(key)
                continue
            default = _default(field)
            parts = (
                _type(field.annotation),
                default if default == "required" else "default " + default,
                _constraints(field.metadata),
            )
            kind = "<br>".join(_cell(part) for part in parts if part)
            rows.append(f"| `{name}` | {kind} | {_cell(meaning)} |")
        if rows:
            title = f"`[{prefix}]`" if prefix else "Top level"
            out += [
                f"### {title}",
                "",
                f"{_cell(inspect.getdoc(model) or '')}",
                "",
                "| key | type, default, range | meaning |",
                "|---|---|---|",
                *rows,
                "",
            ]
    stale = sorted(set(meanings) - seen)
    if missing or stale:
        raise ValueError(
            f"deploy.toml keys without a meaning: {missing}; meanings of no key: {stale} "
            "(docs/reference/deploy-keys.toml, or a comment beside the field)"
        )
    return "\n".join(out)


def _bare(annotation: Any) -> Any:
    while get_origin(annotation) is not None and get_origin(annotation).__name__ == "Annotated":
        annotation = get_args(annotation)[0]
    return annotation


def _table_of(annotation: Any) -> type[BaseModel] | None:
    annotation = _bare(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is dict:
        value = _bare(get_args(annotation)[1])
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
    return None


def _type(annotation: Any) -> str:
    annotation = _bare(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        return " or ".join(f'`"{a}"`' for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type(m) for m in members)
    if origin in (tuple, list):
        return f"list of {_type(get_args(annotation)[0])}s"
    if origin is dict:
        return f"table of {_type(get_args(annotation)[1])}s"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(annotation, str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def _constraints(metadata: list[Any]) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    parts = []
    for item in metadata:
        for attr, sign in signs.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} {value:,g}" if isinstance(value, float) else f"{sign} {value:,}")
    return ", ".join(parts)


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """The comment beside each field of ``model``'s class body: on its line, else the block above it."""
    source = textwrap.dedent(inspect.getsource(model))
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        line = lines[node.lineno - 1]
        trailing = line.split("  # ", 1)[1] if "  # " in line else ""
        above: list[str] = []
        n = node.lineno - 2
        while n >= 0 and lines[n].strip().startswith("#"):
            above.insert(0, lines[n].strip().lstrip("#").strip())
            n -= 1
        text = trailing or " ".join(above)
        out[node.target.id] = re.sub(r" ?\(issue \d+\)", "", text)
    return out


# --- exit codes, metrics, states ------------------------------------------------------------------------


def exit_codes() -> str:
    from orchestrator import errors

    classes = sorted(
        (c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.OrchestratorError)),
        key=lambda c: (c.exit_code, c is not errors.OrchestratorError, c.__name__),
    )
    out = ["| exit code | error | raised when |", "|---|---|---|"]
    for c in classes:
        out.append(f"| {c.exit_code} | `{c.__name__}` | {_cell(inspect.getdoc(c) or '')} |")
    return "\n".join(out) + "\n"


def metrics() -> str:
    from prometheus_client.metrics import MetricWrapperBase

    from orchestrator.agent.metrics import Metrics

    out = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for value in vars(Metrics(None)).values():
        if isinstance(value, MetricWrapperBase):
            name = value._name + ("_total" if value._type == "counter" else "")
            labels = ", ".join(f"`{label}`" for label in value._labelnames)
            out.append(f"| `{name}` | {value._type} | {labels} | {_cell(value._documentation)} |")
    return "\n".join(out) + "\n"


def states() -> str:
    from orchestrator.core import states as s

    table = s.TRANSITIONS
    out = [
        "| phase | what it does | `ok` | `fail` | `fail` (no fallback) | other events |",
        "|---|---|---|---|---|---|",
    ]
    for phase in s.Phase:

        def to(event: Any, fallback: Any, phase: Any = phase) -> str:
            there = table.get((phase, event, fallback))
            return f"`{there.value}`" if there is not None else ""

        extra = [e for e in s.Event if e not in (s.Event.OK, s.Event.FAIL) and (phase, e, s.Fallback.PREVIOUS) in table]
        others = ", ".join(f"`{e.value}` → `{table[phase, e, s.Fallback.PREVIOUS].value}`" for e in extra)
        label = s.TEXT[phase].label if phase in s.TEXT else ""
        end = " (final)" if phase in s.TERMINAL else ""
        ok, fail, fail_none = (
            to(s.Event.OK, s.Fallback.PREVIOUS),
            to(s.Event.FAIL, s.Fallback.PREVIOUS),
            to(s.Event.FAIL, s.Fallback.NONE),
        )
        out.append(f"| `{phase.value}`{end} | {_cell(label)} | {ok} | {fail} | {fail_none} | {others} |")
    return "\n".join(out) + "\n"


def states_diagram() -> str:
    from orchestrator.core import states as s

    edges: dict[tuple[str, str], list[str]] = {}
    for (here, event, fallback), there in s.TRANSITIONS.items():
        label = event.value + (
            " (no fallback)"
            if fallback is s.Fallback.NONE
            and event is s.Event.FAIL
            and s.TRANSITIONS.get((here, event, s.Fallback.PREVIOUS)) != there
            else ""
        )
        edges.setdefault((here.value, there.value), [])
        if label not in edges[here.value, there.value]:
            edges[here.value, there.value].append(label)
    out = ["```mermaid", "stateDiagram-v2", f"    [*] --> {s.Phase.PLANNED.value}"]
    for (here, there), labels in edges.items():
        out.append(f"    {here} --> {there}: {', '.join(labels)}")
    out += [f"    {p.value} --> [*]" for p in s.Phase if p in s.TERMINAL]
    out.append("```")
    return "\n".join(out) + "\n"


GENERATORS = {
    "cli": cli,
    "config-keys": config_keys,
    "exit-codes": exit_codes,
    "metrics": metrics,
    "states": states,
    "states-diagram": states_diagram,
}
