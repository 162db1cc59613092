"""Fan one request out to many boxes' agents and wait for all of them, on one thread.

The work runs in the agents (each box switches itself; that is the concurrency): the controller
only sends each agent its request on a relay channel and multiplexes the replies with a selector
(paramiko channels and Unix sockets both have a ``fileno`` that select understands). No thread
pool: a batch of N hosts costs N open channels, and a controller that dies leaves N agents that
carry on.
"""

from __future__ import annotations

import json
import selectors
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.agent.protocol import encode, raise_error
from orchestrator.client.backends import AgentClient
from orchestrator.errors import OrchestratorError

EventCallback = Callable[[str, str, dict[str, Any]], None]  # host, event, fields


@dataclass
class Call:
    host: str
    client: AgentClient
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Open:
    call: Call
    stream: Any
    buf: bytearray = field(default_factory=bytearray)


def run_all(calls: Sequence[Call], on_event: EventCallback | None = None) -> dict[str, Any]:
    """Each host's result, or the OrchestratorError its agent (or the way there) answered."""
    results: dict[str, Any] = {}
    sel = selectors.DefaultSelector()
    try:
        for call in calls:
            try:
                stream = call.client._open()
                stream.sendall(encode({"op": call.op, "args": call.args}))
            except OrchestratorError as exc:
                results[call.host] = exc
                continue
            sel.register(stream, selectors.EVENT_READ, _Open(call, stream))
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
    return results


def _read(item: _Open, results: dict[str, Any], on_event: EventCallback | None) -> bool:
    """Consume what arrived on one stream; True once its reply (or its end) is in."""
    host = item.call.host
    data = item.stream.recv(65536)
    if not data:
        results[host] = item.call.client._closed_early(item.call.op, item.stream)
        return True
    item.buf += data
    while b"\n" in item.buf:
        line, _, rest = bytes(item.buf).partition(b"\n")
        item.buf[:] = rest
        msg = json.loads(line)
        if "event" in msg:
            if on_event is not None:
                on_event(host, str(msg["event"]), dict(msg.get("fields") or {}))
            continue
        if "error" in msg:
            try:
                raise_error(msg["error"])
            except OrchestratorError as exc:
                results[host] = exc
        else:
            results[host] = msg.get("result")
        return True
    return False
