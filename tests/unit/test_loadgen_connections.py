"""How a level starts: its C connections are open before its window, and its C requests go out at once.

A real HTTP/1.1 server on loopback (asyncio streams, keep-alive, chunked SSE) records when it accepted
each connection and when each request arrived, on perf_counter: the load generator's clock.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from time import perf_counter

import pytest

from orchestrator.errors import TransportError
from orchestrator.loadgen import BenchPlan, BenchTarget, ClientKind, LoadGenerator
from orchestrator.loadgen.http import _hold_together, open_backend
from orchestrator.loadgen.sse import StreamError


@dataclass
class Seen:
    conn: int
    accepted: float
    path: str
    arrived: float


@dataclass
class RecordingServer:
    """Answers /v1/models and streamed completions of max_tokens one-token events plus usage.
    ``hold_until`` > 0: no completion of the level (max_tokens > 1: calibration probes ask for 1) is answered
    until that many are open at once, or 10 s pass."""

    hold_until: int = 0
    seen: list[Seen] = field(default_factory=list)
    port: int = 0
    open_completions: int = 0
    peak_open: int = 0
    _conns: int = 0

    def __post_init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._enough: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._enough = asyncio.Event()
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _shutdown(self) -> None:
        """The listener closed and every connection's task cancelled and awaited (none left pending)."""
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns += 1
        conn, accepted = self._conns, perf_counter()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = perf_counter()
                lines = head.decode().split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                path = lines[0].split()[1]
                self.seen.append(Seen(conn, accepted, path, arrived))
                if path == "/v1/models":
                    data = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(data), data)
                    )
                else:
                    await self._stream(writer, json.loads(body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, req: dict[str, object]) -> None:
        assert self._enough is not None
        tokens = req["max_tokens"]
        assert isinstance(tokens, int)
        held = self.hold_until > 0 and tokens > 1
        self.open_completions += held
        self.peak_open = max(self.peak_open, self.open_completions)
        if held and self.open_completions >= self.hold_until:
            self._enough.set()
        if held:
            try:
                await asyncio.wait_for(self._enough.wait(), 10)
            except TimeoutError:
                pass
        prompt = str(req["prompt"])
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        events = [{"choices": [{"index": 0, "text": " a"}]} for _ in range(tokens)]
        events.append({"choices": [], "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": tokens}})
        for event in [*(f"data: {json.dumps(e)}\n\n" for e in events), "data: [DONE]\n\n"]:
            data = event.encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        writer.write(b"0\r\n\r\n")
        self.open_completions -= held


@pytest.fixture(params=["aiohttp", "httpx"])
def client(request: pytest.FixtureRequest) -> ClientKind:
    """Every behaviour holds for both HTTP clients."""
    kind: ClientKind = request.param
    return kind


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    s = RecordingServer()
    yield s
    s.stop()


def run_level(url: str, concurrency: int, requests: int, client: ClientKind) -> LoadGenerator:
    gen = LoadGenerator(
        BenchTarget(url, model="m"),
        BenchPlan(concurrency=(concurrency,), requests=requests, prompt_tokens=16, max_tokens=4),
        client=client,
        keep_traces=True,
    )
    asyncio.run(gen.run())
    return gen


def test_every_connection_of_a_level_is_open_before_its_window(server: RecordingServer, client: ClientKind) -> None:
    """C=16: every connection that carries the level's requests was accepted before the window started."""
    gen = run_level(server.url, 16, 48, client)
    window = gen.traces[0].start
    level = [s for s in server.seen if s.path == "/v1/completions" and s.arrived >= window]
    assert len(level) == 48
    assert [s for s in level if s.accepted >= window] == []


def test_the_window_starts_after_the_connections_are_answered(server: RecordingServer, client: ClientKind) -> None:
    """The level's C GET /v1/models arrive before its window, none inside it."""
    gen = run_level(server.url, 8, 8, client)
    window = gen.traces[0].start
    models = [s.arrived for s in server.seen if s.path == "/v1/models"]
    assert len(models) == 8
    assert max(models) < window


def test_all_c_requests_are_in_flight_before_the_first_answer(client: ClientKind) -> None:
    """A server that answers nothing until C=32 completions are open at once gets them all, and sees 32 open."""
    server = RecordingServer(hold_until=32)
    try:
        gen = run_level(server.url, 32, 32, client)
    finally:
        server.stop()
    assert server.peak_open == 32
    assert gen.traces[0].outcomes and all(o.ok for o in gen.traces[0].outcomes)


def test_a_target_that_refuses_connections_is_a_transport_error(client: ClientKind) -> None:
    """Nothing listens: opening the level's connections fails as TransportError naming the count and the URL."""
    server = RecordingServer()
    url = server.url
    server.stop()
    gen = LoadGenerator(
        BenchTarget(url, model="m"), BenchPlan(concurrency=(4,), requests=4, warmup=False), client=client
    )
    with pytest.raises(TransportError, match=f"bench: opening 4 connections to {url}: connect"):
        asyncio.run(gen.run())


def test_no_copy_passes_the_meeting_until_every_copy_has_reached_it() -> None:
    """hold_open's meeting: a connection is released only once all C hold theirs (none lends its own)."""
    started: list[int] = []
    arrived: list[int] = []
    passed: list[tuple[int, int]] = []

    async def one(meet: Callable[[], Awaitable[object]]) -> None:
        n = len(started)
        started.append(n)
        await asyncio.sleep(0.01 * n)  # the copies arrive one by one
        arrived.append(n)
        await meet()
        passed.append((n, len(arrived)))

    asyncio.run(_hold_together(5, one))
    assert sorted(n for n, _ in passed) == [0, 1, 2, 3, 4] and {seen for _, seen in passed} == {5}


def test_a_failed_copy_breaks_the_meeting_and_its_error_is_raised() -> None:
    """One GET failing does not leave the others waiting for it: the run stops with that GET's error."""

    async def one(meet: Callable[[], Awaitable[object]]) -> None:
        if not getattr(one, "failed", False):
            one.failed = True  # type: ignore[attr-defined]
            raise StreamError("connect", "refused")
        await meet()

    with pytest.raises(StreamError, match="refused"):
        asyncio.run(asyncio.wait_for(_hold_together(4, one), 10))


def test_hold_open_leaves_exactly_c_connections_on_the_server(server: RecordingServer, client: ClientKind) -> None:
    """C GETs held together arrive on C distinct connections."""

    async def go() -> None:
        backend = open_backend(client, server.url, {}, 10.0, 12)
        try:
            await backend.hold_open("/v1/models", 12)
        finally:
            await backend.aclose()

    asyncio.run(go())
    assert len({s.conn for s in server.seen if s.path == "/v1/models"}) == 12
