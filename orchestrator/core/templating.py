"""Jinja templates compiled once per source text: a template's compile (~10 ms for haproxy.cfg.j2) is
paid once per process, not on every render; a warm switch renders the proxy's config inside the window
in which clients wait. Pure: the cache maps a text (and how it is read) to its compiled template."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jinja2

Helpers = tuple[tuple[str, Callable[..., Any]], ...]


@functools.lru_cache(maxsize=32)
def compiled(source: str, *, trim: bool = True, filters: Helpers = (), helpers: Helpers = ()) -> jinja2.Template:
    """``source`` compiled: undefined names fail, nothing is escaped, the last newline stays; ``trim``:
    block tags take their line with them; ``filters`` and ``helpers`` (globals) by name."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=trim,
        lstrip_blocks=trim,
    )
    env.filters.update(dict(filters))
    env.globals.update(dict(helpers))
    return env.from_string(source)
