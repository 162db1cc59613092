"""Bytes from a user's file or request into data, bounded (pure: bytes in, data or one error out).

Every TOML and JSON document the product reads on user input goes through here, so that what the
parsers themselves do not bound becomes one DocumentError naming where the document came from
and what is wrong with it, never a traceback: bytes that are not UTF-8 (UnicodeDecodeError),
nesting deep enough to exhaust the parser's recursion (RecursionError), numbers too long for
Python's int conversion (ValueError) or too large to be a float (1e999 becomes inf), duplicate
JSON keys (the last would silently win) and JSON's non-standard NaN/Infinity.
"""

from __future__ import annotations

import json
import math
import tomllib
from typing import Any

from orchestrator.errors import ConfigError

# Deeper than any deploy.toml, hosts.toml, config.json or request needs; shallow enough that
# every recursive consumer downstream (validation, secret scans, messages) stays far from the limit.
MAX_DEPTH = 64
# Python refuses to convert longer digit strings (sys.int_info.default_max_str_digits is 4300);
# no setting or argument of ours needs more than a few dozen digits.
MAX_DIGITS = 100


class DocumentError(ConfigError):
    """A document that cannot be read as data; ``reason`` is the message without the place."""

    def __init__(self, reason: str, where: str, *, syntax: bool = False) -> None:
        super().__init__(reason, file=where)
        self.reason = reason
        self.syntax = syntax  # the parser's own complaint (not TOML/JSON at all), not one of our bounds


def clip(value: str, limit: int = 60) -> str:
    """``value`` quoted, cut to ``limit`` characters with its full length said when longer."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value):,} characters)"


def text_of(raw: bytes | str, where: str) -> str:
    """UTF-8 text, or a DocumentError naming the first bad byte by line and column."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DocumentError(
            f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line}, column {column} "
            "(TOML, JSON and deploy files must be UTF-8)",
            where,
        ) from None


def toml_document(raw: bytes | str, where: str) -> dict[str, Any]:
    """A TOML document as a dict, bounded as the module says."""
    text = text_of(raw, where)
    try:
        data = tomllib.loads(text, parse_float=lambda s: _finite(s, where))
    except tomllib.TOMLDecodeError as exc:
        raise DocumentError(f"not valid TOML: {exc}", where, syntax=True) from None
    except RecursionError:
        raise DocumentError(f"not valid TOML: nested deeper than {MAX_DEPTH} levels", where) from None
    except ValueError as exc:  # tomllib's int() of a digit string past Python's limit
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"not valid TOML: a number longer than {MAX_DIGITS} digits", where) from None
    check_depth(data, where)
    return data


def json_document(raw: bytes | str, where: str, *, unique_keys: bool = True) -> Any:
    """A JSON document, bounded as the module says; duplicate keys refused unless ``unique_keys`` is off
    (a config.json downloaded from the hub is taken as Python reads it: the last key wins)."""
    text = text_of(raw, where)
    try:
        data = json.loads(
            text,
            parse_int=lambda s: _integer(s, where),
            parse_float=lambda s: _finite(s, where),
            parse_constant=lambda s: _constant(s, where),
            object_pairs_hook=(lambda pairs: _unique(pairs, where)) if unique_keys else None,
        )
    except RecursionError:
        raise DocumentError(f"not valid JSON: nested deeper than {MAX_DEPTH} levels", where) from None
    except DocumentError:
        raise
    except json.JSONDecodeError as exc:
        raise DocumentError(f"not valid JSON: {exc}", where, syntax=True) from None
    except ValueError as exc:
        raise DocumentError(f"not valid JSON: {exc}", where) from None
    check_depth(data, where)
    return data


def check_depth(data: Any, where: str) -> None:
    """Refuse a structure nested deeper than MAX_DEPTH (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, dict | list):
                if depth + 1 > MAX_DEPTH:
                    raise DocumentError(f"nested deeper than {MAX_DEPTH} levels", where)
                stack.append((child, depth + 1))


def _integer(text: str, where: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise DocumentError(f"not valid JSON: a number of {len(text):,} digits (at most {MAX_DIGITS})", where)
    return int(text)


def _finite(text: str, where: str) -> float:
    value = float(text)
    if math.isinf(value) and text.lstrip("+-").lower() != "inf":
        raise DocumentError(f"number {clip(text, 30)} is too large to be a float", where)
    return value


def _constant(text: str, where: str) -> float:
    raise DocumentError(f"not valid JSON: {text} is not a JSON number", where)


def _unique(pairs: list[tuple[str, Any]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DocumentError(
                f"duplicate key {clip(key, 40)} in one JSON object (which one counts would be a guess)", where
            )
        out[key] = value
    return out
