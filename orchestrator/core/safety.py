"""What may be written into a unit file at all.

A value that could end a line, smuggle a directive or confuse systemd's own unquoting is refused
here, before any rendering; the renderer then only has to escape the few characters systemd
interprets inside a quoted word.
"""

from __future__ import annotations

import unicodedata

from orchestrator.errors import RenderError

# Cc: control characters (newline, CR, tab, NUL...), Cs: lone surrogates (not encodable as UTF-8),
# Zl/Zp: Unicode line/paragraph separators, which some readers treat as a line end.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def check_safe_text(value: str, what: str) -> None:
    """Raise RenderError naming ``what`` and the value when it cannot go into a unit file."""
    for ch in value:
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise RenderError(f"{what} {value!r} contains the control character {ch!r} "
                              f"(U+{ord(ch):04X}); it cannot be written into a unit file")
    for quote in ('"', "'"):
        if value.count(quote) % 2:
            raise RenderError(f"{what} {value!r} has an unbalanced {quote} quote")
