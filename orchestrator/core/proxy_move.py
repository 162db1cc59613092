"""Moving a route in the running proxy without a reload (pure): whether a new config can be served
through HAProxy's runtime API, and with which commands.

A served name routes to one backend, and that backend lists a server for every engine that may serve
the name on the host (the route's, the catalog's alternates, the engine on demand: haproxy.cfg.j2), each
``disabled`` but the one routed. Two configs that differ only in which of those servers are disabled
(and in comments) route differently in that alone, and the running worker can be brought from one to
the other with ``set server B/S state ready|maint``: no re-exec, no new worker, no window in which a
request reaches a worker of the old config. A warm switch between alternates (the same served name) is
such a move, and so is each half of an on-demand swap between names on demand (their backends stay, named
in the names' order, every server disabled while nothing routes them: the displaced engine leaves, then
the target's comes); anything else (a name added, a gap, a list of known names, a new server) reloads.

The decision compares the running config's text with the new one's, so it holds only where the running
worker serves the config on disk (the adapter's ``.applied`` hash says so) with no server state changed
since (a withdraw clears that hash first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.core.haproxy_cli import CURRENT_STAT, stat_rows

_SERVER = re.compile(r"^(\s*server\s+(\S+)\s+.*?)(\s+disabled)?\s*$")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class ServerState:
    """One server whose runtime state a move changes: ``ready`` (serves) or not (maintenance)."""

    backend: str
    server: str
    ready: bool


def _skeleton(config: str) -> tuple[list[str], dict[tuple[str, str], bool]]:
    """The config's lines without comment lines and without the servers' ``disabled`` word, and each
    server's enabled state by (backend, server)."""
    lines: list[str] = []
    enabled: dict[tuple[str, str], bool] = {}
    backend = ""
    for line in config.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] in ("backend", "frontend", "defaults", "global", "listen"):
            backend = words[1] if words[0] == "backend" and len(words) > 1 else ""
        match = _SERVER.match(line) if words[0] == "server" and backend else None
        if match is not None:
            enabled[(backend, match.group(2))] = match.group(3) is None
            line = match.group(1)
        lines.append(line.rstrip())
    return lines, enabled


def server_states(config: str) -> dict[tuple[str, str], bool]:
    """Each backend server of a rendered config and whether it is enabled (not ``disabled``)."""
    return _skeleton(config)[1]


def runtime_move(running: str, wanted: str) -> tuple[ServerState, ...] | None:
    """The server states that bring a worker serving ``running`` to route as ``wanted`` does: those to
    make ready first, then those to put in maintenance (never a moment with no server for a name that
    has one before and after). None when the configs differ in anything else (a reload is needed) or
    a name is not one the runtime API takes; () when they route the same."""
    old_lines, old = _skeleton(running)
    new_lines, new = _skeleton(wanted)
    if old_lines != new_lines or old.keys() != new.keys():
        return None
    changed = [ServerState(b, s, new[(b, s)]) for (b, s) in sorted(new) if new[(b, s)] != old[(b, s)]]
    if any(not (_NAME.fullmatch(c.backend) and _NAME.fullmatch(c.server)) for c in changed):
        return None
    return tuple(sorted(changed, key=lambda c: not c.ready))


def move_commands(changes: tuple[ServerState, ...]) -> list[str]:
    """One master CLI line for the current worker (HAProxy 2.6: ``@1``) with every state change in
    order, then the command whose answer proves them (``moved``)."""
    line = "; ".join(f"@1 set server {c.backend}/{c.server} state {'ready' if c.ready else 'maint'}" for c in changes)
    return [line, CURRENT_STAT]


def moved(stat: str, changes: tuple[ServerState, ...]) -> bool:
    """Whether the current worker's ``show stat`` shows every change made: a server made ready is out
    of maintenance, one put in maintenance is in it."""
    status = {(r.get("pxname"), r.get("svname")): r.get("status", "") for r in stat_rows(stat)}
    for c in changes:
        now = status.get((c.backend, c.server))
        if now is None or now.startswith("MAINT") == c.ready:
            return False
    return True
