"""The HTTP client under the load generator, behind one small interface with two implementations.

aiohttp is the default when it is installed: its C parser costs ~9-10 us of CPU per streamed token
against ~30-36 us for httpx (h11 handles each HTTP chunk, i.e. each token, in Python), measured
with bench/loadgen/loadgen.py's server at C=256. httpx (already a dependency) is the fallback.
Both keep HTTP/1.1 connections alive, one per concurrent stream, and report transport failures
as ``StreamError`` kinds: connect, timeout, connection_lost, bad_response.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, Protocol

import httpx

from orchestrator.loadgen.sse import StreamError

if TYPE_CHECKING:
    import aiohttp

ClientKind = Literal["aiohttp", "httpx"]
OnData = Callable[[bytes], None]


class HttpBackend(Protocol):
    name: ClientKind

    async def get(self, path: str) -> tuple[int, bytes]:
        """(status, body); transport failures raise StreamError."""
        ...

    async def hold_open(self, path: str, count: int) -> None:
        """``count`` GETs of path at once, each holding its connection until every one has its answer's
        head: the pool then keeps ``count`` open connections. Transport failures raise StreamError."""
        ...

    async def post_stream(self, path: str, body: bytes, on_data: OnData) -> tuple[int, bytes]:
        """POST a JSON body. On 200 every piece of the response body goes to on_data as it arrives
        and (200, b"") is returned; otherwise (status, body). Errors from on_data propagate."""
        ...

    async def aclose(self) -> None: ...


async def _hold_together(count: int, one: Callable[[Callable[[], Awaitable[object]]], Awaitable[None]]) -> None:
    """Run ``count`` copies of ``one(meet)``; ``meet()`` returns once every copy has called it. A GET that
    gathers alone could finish before another starts and lend it its connection: the pool would then
    hold fewer than ``count``. The first failure breaks the meeting for the others and is raised."""
    barrier = asyncio.Barrier(count)

    async def guarded() -> None:
        try:
            await one(barrier.wait)
        except asyncio.BrokenBarrierError:
            return  # another copy failed: its error is the one raised
        except BaseException:  # any failure, cancellation included, breaks the meeting for the others; re-raised
            await barrier.abort()
            raise

    answers = await asyncio.gather(*(guarded() for _ in range(count)), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer


def default_client() -> ClientKind:
    return "aiohttp" if importlib.util.find_spec("aiohttp") is not None else "httpx"


def open_backend(
    kind: ClientKind, base_url: str, headers: dict[str, str], timeout_s: float, connections: int
) -> HttpBackend:
    if kind == "aiohttp":
        return AiohttpBackend(base_url, headers, timeout_s, connections)
    return HttpxBackend(base_url, headers, timeout_s, connections)


class HttpxBackend:
    name: ClientKind = "httpx"

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float, connections: int) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            trust_env=False,
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )
        self._connections = connections

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            resp = await self._client.get(path)
        except httpx.HTTPError as exc:
            raise _httpx_error(exc) from exc
        return resp.status_code, resp.content

    async def hold_open(self, path: str, count: int) -> None:
        async def one(meet: Callable[[], Awaitable[object]]) -> None:
            try:
                async with self._client.stream("GET", path) as resp:  # the connection is ours until closed
                    await meet()
                    await resp.aread()
            except httpx.HTTPError as exc:
                raise _httpx_error(exc) from exc

        await _hold_together(min(count, self._connections), one)

    async def post_stream(self, path: str, body: bytes, on_data: OnData) -> tuple[int, bytes]:
        try:
            async with self._client.stream("POST", path, content=body) as resp:
                if resp.status_code != 200:
                    return resp.status_code, await resp.aread()
                async for data in resp.aiter_bytes():
                    on_data(data)
                return 200, b""
        except httpx.HTTPError as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        await self._client.aclose()


def _httpx_error(exc: httpx.HTTPError) -> StreamError:
    if isinstance(exc, httpx.TimeoutException):
        return StreamError("timeout", repr(exc))
    if isinstance(exc, httpx.ConnectError):
        return StreamError("connect", repr(exc))
    if isinstance(exc, httpx.TransportError):
        return StreamError("connection_lost", repr(exc))
    return StreamError("bad_response", repr(exc))


class AiohttpBackend:
    name: ClientKind = "aiohttp"

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float, connections: int) -> None:
        import aiohttp  # optional dependency: only this backend needs it

        self._base = base_url.rstrip("/")
        # a session is bound to the running loop: create it lazily, inside the loop
        self._session: aiohttp.ClientSession | None = None
        self._headers = headers
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=timeout_s)
        self._connections = connections

    def _open(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                trust_env=False,
                connector=aiohttp.TCPConnector(limit=self._connections, limit_per_host=0),
            )
        return self._session

    async def get(self, path: str) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with self._open().get(self._base + path) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _aiohttp_error(exc) from exc

    async def hold_open(self, path: str, count: int) -> None:
        import aiohttp

        async def one(meet: Callable[[], Awaitable[object]]) -> None:
            try:
                async with self._open().get(self._base + path) as resp:  # held until its body is read
                    await meet()
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _aiohttp_error(exc) from exc

        await _hold_together(min(count, self._connections), one)

    async def post_stream(self, path: str, body: bytes, on_data: OnData) -> tuple[int, bytes]:
        import aiohttp

        try:
            async with self._open().post(self._base + path, data=body) as resp:
                if resp.status != 200:
                    return resp.status, await resp.read()
                async for data in resp.content.iter_any():
                    on_data(data)
                return 200, b""
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _aiohttp_error(exc) from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _aiohttp_error(exc: BaseException) -> StreamError:
    import aiohttp

    if isinstance(exc, aiohttp.ClientConnectorError):
        return StreamError("connect", repr(exc))
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return StreamError("timeout", repr(exc))
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
        return StreamError("connection_lost", repr(exc))
    return StreamError("bad_response", repr(exc))
