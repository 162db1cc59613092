"""Reading the project's own source as syntax trees (the layer, Rule-1 and engine-package tests)."""

from __future__ import annotations

import ast
import time
from pathlib import Path

_ATTEMPTS = 5


def parse(path: Path) -> ast.Module:
    """``ast.parse`` of one file. CPython 3.11 counts the AST builder's recursion depth per interpreter, not
    per thread (python/cpython gh-106905): a parse that meets another thread's (a server or agent thread an
    earlier test left running) raises SystemError "AST constructor recursion depth mismatch". The source is
    not at fault: parse it again."""
    source = path.read_text()
    for attempt in range(_ATTEMPTS):
        try:
            return ast.parse(source, str(path))
        except SystemError:
            if attempt == _ATTEMPTS - 1:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")
