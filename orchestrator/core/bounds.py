"""Numbers typed by a user, bounded (pure): every numeric option goes through one of these, so none
is unbounded (a 5,000-digit id reached SQLite as an OverflowError), none is NaN or infinite (NaN
passes every comparison, so a range check alone lets it through), and a huge value is quoted cut
short. Each raises ValueError with a message that quotes the value; callers add the option name."""

from __future__ import annotations

import math
import re

from orchestrator.core.documents import clip

# SQLite's INTEGER: ids and revision numbers are stored there.
MAX_ID = 2**63 - 1
_INT_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,4})?", re.ASCII)
_DIGITS = 40  # past this many characters a number is out of every range here; int() is never asked


def parse_int(text: str, lo: int, hi: int) -> int:
    """ASCII digits only (int() also takes '٣' and '1_000'), within [lo, hi]."""
    stripped = text.strip()
    if not _INT_RE.fullmatch(stripped):
        raise ValueError(f"{clip(text)} is not a whole number of ASCII digits")
    if len(stripped) > _DIGITS:
        raise ValueError(
            f"{clip(text)} is {'less' if stripped.startswith('-') else 'more'} than "
            f"{lo if stripped.startswith('-') else hi}"
        )
    value = int(stripped)
    _check(value, lo, hi, text)
    return value


def parse_float(text: str, lo: float, hi: float) -> float:
    """A finite decimal number within [lo, hi] (no nan, inf or hex)."""
    stripped = text.strip()
    if not _FLOAT_RE.fullmatch(stripped) or len(stripped) > _DIGITS:
        raise ValueError(f"{clip(text)} is not a finite decimal number of at most {_DIGITS} characters")
    value = float(stripped)
    if not math.isfinite(value):
        raise ValueError(f"{clip(text)} is not a finite number")
    _check(value, lo, hi, text)
    return value


def parse_int_list(text: str, lo: int, hi: int) -> tuple[int, ...]:
    """``1,64,256``: each an int within [lo, hi], each once, in the given order."""
    items = [p.strip() for p in text.split(",")]
    if not text.strip():
        raise ValueError("empty: expected comma-separated whole numbers like 1,64,256")
    values = tuple(parse_int(p, lo, hi) for p in items)
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ValueError(f"{twice[0]} is given twice")
    return values


def _check(value: float, lo: float, hi: float, text: str) -> None:
    if value < lo:
        raise ValueError(f"{clip(text)} is less than {_num(lo)}")
    if value > hi:
        raise ValueError(f"{clip(text)} is more than {_num(hi)}")


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"
