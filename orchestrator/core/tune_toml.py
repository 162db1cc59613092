"""Write a tuned layout back into deploy.toml as a text edit, so comments and order survive.

Only the ``[models.NAME]`` table's own key lines change: a key that is there gets its value
replaced (its trailing comment kept), a missing one is added after the table's last key. The
result is parsed again and checked to hold exactly the new values.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.core.documents import DocumentError, toml_document
from orchestrator.errors import UsageError

_HEADER_RE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY_RE = re.compile(r"^(\s*)([A-Za-z0-9_-]+)(\s*=\s*)(.*)$")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def _table_names(header: str) -> tuple[str, ...]:
    return tuple(p.strip().strip('"').strip("'") for p in re.split(r"\.(?=(?:[^\"]*\"[^\"]*\")*[^\"]*$)", header))


def _split_comment(rest: str) -> tuple[str, str]:
    """``8 # note`` -> ("8", " # note"); values here are numbers, booleans or flat lists."""
    i = rest.find("#")
    if i < 0:
        return rest.rstrip(), ""
    value = rest[:i].rstrip()
    return value, rest[len(value) :].rstrip()


def edit_model(text: str, model: str, changes: Mapping[str, Any], file: str = "deploy.toml") -> str:
    lines = text.splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        m = _HEADER_RE.match(line)
        if not m:
            continue
        if start is not None:
            end = i
            break
        if _table_names(m.group(1)) == ("models", model):
            start = i
    if start is None:
        raise UsageError(f"{file}: no [models.{model}] table to write the tuned layout into")
    end = len(lines) if end is None else end
    last_key = start
    pending = dict(changes)
    for i in range(start + 1, end):
        m = _KEY_RE.match(lines[i])
        if not m:
            continue
        last_key = i
        key = m.group(2)
        if key in pending:
            value, comment = _split_comment(m.group(4))
            if value.startswith("[") and not value.endswith("]"):
                raise UsageError(f"{file}: models.{model}.{key} spans several lines; edit it by hand")
            newline = "\n" if lines[i].endswith("\n") else ""
            lines[i] = f"{m.group(1)}{key}{m.group(3)}{toml_value(pending.pop(key))}{comment}{newline}"
    if pending:
        if not lines[last_key].endswith("\n"):
            lines[last_key] += "\n"
        added = [f"{k} = {toml_value(v)}\n" for k, v in pending.items()]
        lines[last_key + 1 : last_key + 1] = added
    new = "".join(lines)
    _check(new, model, changes, file)
    return new


def _check(text: str, model: str, changes: Mapping[str, Any], file: str) -> None:
    try:
        table = toml_document(text, file)["models"][model]
    except DocumentError as exc:
        raise UsageError(
            f"{file}: the edited [models.{model}] would not parse ({exc.reason}); edit it by hand"
        ) from exc
    except KeyError as exc:
        raise UsageError(f"{file}: the edited [models.{model}] would not parse ({exc}); edit it by hand") from exc
    for key, want in changes.items():
        got = table.get(key)
        if (list(got) if isinstance(got, list) else got) != (list(want) if isinstance(want, tuple) else want):
            raise UsageError(f"{file}: models.{model}.{key} would read {got!r}, not {want!r}; edit it by hand")


def unified_diff(old: str, new: str, file: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{file}", tofile=f"b/{file}"
        )
    )


def layout_changes(
    current: Mapping[str, Any], target: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Keys whose value changes; a key absent from the file counts as its default."""
    out: dict[str, Any] = {}
    for key, want in target.items():
        have = current.get(key, defaults.get(key))
        if (list(have) if isinstance(have, (list, tuple)) else have) != (
            list(want) if isinstance(want, (list, tuple)) else want
        ):
            out[key] = list(want) if isinstance(want, tuple) else want
    return out
