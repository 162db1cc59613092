"""A trailing newline is no part of a valid name: each key checked by a pattern refuses "value\\n" at load
(exit 2, naming the key), as Python's `$` would have let it through before the line end."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.tune import parse_layouts
from orchestrator.errors import UsageError
from tests.unit.test_probe_config import refused, write


@pytest.mark.parametrize(
    "where,line,key",
    [
        ("top", 'socket_group = "orchestrator\\n"', "socket_group"),
        ("rest", '[proxy]\nbind = "0.0.0.0\\n"', "proxy.bind"),
        ("rest", '[proxy]\nuser = "haproxy\\n"', "proxy.user"),
        ("host", 'bind = "127.0.0.1\\n"', "hosts.box.bind"),
        ("host", 'node_address = "box.lan\\n"', "hosts.box.node_address"),
        (
            "rest",
            '[schedules.nightly]\ncron = "0 3 * * *"\nmodel = "a"\nwindow = "01:00-05:00\\n"',
            "schedules.nightly.window",
        ),
        ("model", 'env = { "OMP_NUM_THREADS\\n" = "4" }', "models.a.env"),
    ],
)
def test_a_trailing_newline_is_refused(tmp_path: Path, where: str, line: str, key: str) -> None:
    """'value\\n' where a name, address or window belongs: refused naming the key."""
    assert f"{key}: " in refused(write(tmp_path, **{where: line}))


def test_a_layout_part_with_a_trailing_newline_is_refused() -> None:
    """`tune --layouts "tp4\\n+ep"`: the part "tp4\\n" is not tp4."""
    with pytest.raises(UsageError):
        parse_layouts("tp4\n+ep")


def test_no_validation_pattern_is_matched_with_match() -> None:
    """The package's name and path patterns (``*_RE``) are applied with fullmatch, never match."""
    import re

    root = Path(__file__).resolve().parents[2] / "orchestrator"
    line_parsers = {root / "core" / "tune_toml.py"}  # match a file's lines, each with its newline kept
    found = [
        f"{p.relative_to(root)}:{n}"
        for p in sorted(set(root.rglob("*.py")) - line_parsers)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\b[A-Z_]*RE\.match\(", line)
    ]
    assert found == []
