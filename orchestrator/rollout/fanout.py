"""Fan one request out to many boxes' agents and wait for all of them.

The work runs in the agents (each box switches itself; that is the concurrency): the controller
only sends each agent its request on a relay channel and multiplexes the replies with a selector on
one thread (paramiko channels and Unix sockets both have a ``fileno`` that select understands); a
batch of N hosts costs N open channels, and a controller that dies leaves N agents that carry on.
Opening a channel blocks (the first one to a box is an SSH handshake, each one a relay exec round
trip), so the opens alone run on a small bounded pool instead of one after another.
"""

from __future__ import annotations

import selectors
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from orchestrator.client.backends import AgentClient, Stream
from orchestrator.contract.wire import ReplyReader
from orchestrator.errors import OrchestratorError

EventCallback = Callable[[str, str, dict[str, Any]], None]  # host, event, fields
OPEN_WORKERS = 8  # SSH handshakes in flight at once; more boxes wait for a free slot


@dataclass
class HostRequest:
    """One host's request: its agent's client, the operation's name and its arguments."""

    host: str
    client: AgentClient
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Open:
    call: HostRequest
    stream: Stream
    reader: ReplyReader = field(default_factory=ReplyReader)


def run_all(calls: Sequence[HostRequest], on_event: EventCallback | None = None) -> dict[str, Any]:
    """Each host's result, or the OrchestratorError its agent (or the way there) answered, in the
    order of ``calls`` whatever order the replies arrive in (refusals name hosts deterministically)."""
    results: dict[str, Any] = {}
    sel = selectors.DefaultSelector()
    try:
        for call, opened in zip(calls, _open_all(calls), strict=True):
            if isinstance(opened, OrchestratorError):
                results[call.host] = opened
            else:
                sel.register(opened, selectors.EVENT_READ, _Open(call, opened))
        while sel.get_map():
            for key, _mask in sel.select():
                item: _Open = key.data
                done = _read(item, results, on_event)
                if done:
                    sel.unregister(item.stream)
                    item.stream.close()
    finally:
        for key in list(sel.get_map().values()):
            key.data.stream.close()
        sel.close()
    return {call.host: results[call.host] for call in calls}


def _open_all(calls: Sequence[HostRequest]) -> list[Any]:
    """Each call's stream with its request sent, or the OrchestratorError opening it raised; the
    opens run concurrently (at most OPEN_WORKERS at once), the list is in the order of ``calls``.
    Each host has its own client, so no client is opened from two threads."""
    if len(calls) <= 1:
        return [_open_one(call) for call in calls]
    with ThreadPoolExecutor(max_workers=min(OPEN_WORKERS, len(calls)), thread_name_prefix="fanout-open") as pool:
        return list(pool.map(_open_one, calls))


def _open_one(call: HostRequest) -> Stream | OrchestratorError:
    try:
        return call.client.send(call.op, call.args)
    except OrchestratorError as exc:
        return exc


def _read(item: _Open, results: dict[str, Any], on_event: EventCallback | None) -> bool:
    """Consume what arrived on one stream; True once its reply (or its end) is in."""
    host = item.call.host
    data = item.stream.recv(65536)
    if not data:
        results[host] = item.call.client.ended(item.call.op, item.stream)
        return True
    for event in item.reader.feed(data):
        if on_event is not None:
            on_event(host, event.name, event.fields)
    reply = item.reader.reply
    if reply is None:
        return False
    results[host] = reply.error if reply.error is not None else reply.result
    return True
