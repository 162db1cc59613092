"""What may be written into a unit file at all.

A value that could end a line, smuggle a directive or confuse systemd's own unquoting is refused
here, before any rendering; the renderer then only has to escape the few characters systemd
interprets inside a quoted word.
"""

from __future__ import annotations

import unicodedata

from orchestrator.errors import RenderError
from orchestrator.secrets import secret_value_kind

# Cc: control characters (newline, CR, tab, NUL...), Cs: lone surrogates (not encodable as UTF-8),
# Zl/Zp: Unicode line/paragraph separators, which some readers treat as a line end, Cf: format
# characters (bidi overrides such as U+202E, zero-width U+200B, BOM), which make a unit read
# differently from what systemd executes.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cs", "Cf", "Zl", "Zp"})


def shown(value: str) -> str:
    """``value`` as a message may quote it: repr, or a placeholder when it looks like a secret."""
    kind = secret_value_kind(value)
    return f"({kind}, not shown)" if kind else repr(value)


def check_safe_text(value: str, what: str) -> None:
    """Raise RenderError naming ``what`` and the value when it cannot go into a unit file."""
    for ch in value:
        category = unicodedata.category(ch)
        if category in _FORBIDDEN_CATEGORIES:
            kind = "control" if category in ("Cc", "Cs") else "invisible format" if category == "Cf" else "line break"
            raise RenderError(
                f"{what} {shown(value)} contains the {kind} character {ch!r} "
                f"(U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}); it cannot be written "
                f"into a unit file"
            )
    for quote in ('"', "'"):
        if value.count(quote) % 2:
            raise RenderError(f"{what} {shown(value)} has an unbalanced {quote} quote")
