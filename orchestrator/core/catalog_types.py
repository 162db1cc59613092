"""The scalar kinds deploy.toml's values must have (pure).

pydantic's lax mode turns ``port = true`` into port 1, ``gpus = [0, true]`` into GPU 1 and
``enabled = 1`` into true: TOML values carry their own types, so a boolean, number or string where
another kind belongs is a mistake to name, not to coerce. Values from the environment are text by
nature (``ORCHESTRATOR_PROXY__PORT=8001``): for them a string is left to pydantic's parsing, while a
JSON table's boolean where a number belongs (or a number where a boolean does) is refused the same.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, NamedTuple, Union, get_args, get_origin

from pydantic import BaseModel

_KIND = {bool: "a boolean (true or false)", int: "an integer", float: "a number"}


class WrongType(NamedTuple):
    """A value of the wrong kind at ``key`` (a dotted key path), with the kind it should be."""

    key: str
    expected: str
    value: Any


def wrong_types(
    data: Mapping[str, Any], model: type[BaseModel], *, text_ok: bool = False, prefix: str = ""
) -> Iterator[WrongType]:
    """Every value of ``data`` (a table for ``model``) whose kind its field does not take, in order.
    Unknown keys and kinds other than booleans and numbers are left to pydantic (it names them)."""
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is not None:
            yield from _check(value, field.annotation, f"{prefix}{key}", text_ok)


def _check(value: Any, annotation: Any, key: str, text_ok: bool) -> Iterator[WrongType]:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if value is not None and len(members) == 1:  # Optional[X]: X's rule
            yield from _check(value, members[0], key, text_ok)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if isinstance(value, Mapping):
            yield from wrong_types(value, annotation, text_ok=text_ok, prefix=key + ".")
    elif origin is dict and isinstance(value, Mapping):
        item = get_args(annotation)[1]
        for name, entry in value.items():
            yield from _check(entry, item, f"{key}.{name}", text_ok)
    elif origin in (tuple, list, set, frozenset) and isinstance(value, (list, tuple)):
        args = get_args(annotation)
        if args and (origin is not tuple or len(args) == 2 and args[1] is Ellipsis):
            for i, entry in enumerate(value):
                yield from _check(entry, args[0], f"{key}[{i}]", text_ok)
    elif annotation in _KIND and not _fits(value, annotation, text_ok):
        yield WrongType(key, _KIND[annotation], value)


def _fits(value: Any, kind: type, text_ok: bool) -> bool:
    if isinstance(value, str):
        return text_ok
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind is int else isinstance(value, (int, float))


def kind_of(value: Any) -> str:
    """How deploy.toml's reader would call ``value``'s kind, for a message."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"
