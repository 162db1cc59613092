"""`orchestrator dashboard`'s local end: a port on 127.0.0.1 that forwards to the agent's dashboard socket.

Each browser connection becomes one stream to the socket: on this machine a Unix connection, with --host a
relay channel on the CLI's one SSH connection (`python -m orchestrator.agent.relay --socket PATH`), so the
box exposes nothing new and the agent sees the SSH login's uid. A loopback port is open to every local
user, so the first request of each connection must carry this session's token (once in the URL printed,
then as a cookie) and a Host header naming the loopback port (no DNS rebinding); anything else gets 403
here and never reaches the box.
"""

from __future__ import annotations

import hmac
import secrets
import socket
import socketserver
import threading
from collections.abc import Callable
from http.cookies import CookieError, SimpleCookie
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

from orchestrator.errors import OrchestratorError, UsageError

MAX_HEAD = 16 * 1024
HEAD_TIMEOUT_S = 10.0
_CHUNK = 65536


class Stream(Protocol):
    """A byte stream to the dashboard socket: a socket, or a paramiko channel."""

    def sendall(self, data: bytes) -> Any: ...

    def recv(self, n: int) -> bytes: ...

    def close(self) -> Any: ...


class RelayStream:
    """A relay channel on the SSH connection; ``failure`` is the relay's own last line once it exited."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    def sendall(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, n: int) -> bytes:
        return bytes(self.channel.recv(n))

    def close(self) -> None:
        self.channel.close()

    def failure(self) -> str | None:
        # The exit status follows the end of the output by a moment; a relay that never exits says nothing.
        if not self.channel.status_event.wait(5.0):
            return None
        err = self.channel.makefile_stderr("rb").read().decode(errors="replace").strip()
        status = self.channel.recv_exit_status()
        return err.splitlines()[-1].removeprefix("error: ") if err else f"the relay exited {status}"


def unix_opener(path: str) -> Callable[[], Stream]:
    def open_() -> Stream:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise OrchestratorError(f"dashboard socket {path}: {exc.strerror or exc}") from exc
        return sock

    return open_


class Forwarder(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, open_upstream: Callable[[], Stream], port: int = 0) -> None:
        self.open_upstream = open_upstream
        self.token = secrets.token_urlsafe(24)
        self.errors: list[str] = []  # upstream failures, for the command to print
        super().__init__(("127.0.0.1", port), _Conn)
        self.port = int(self.server_address[1])
        self.cookie = f"orchestrator_dashboard_{self.port}"  # cookies ignore ports: one name per port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?{urlencode({'token': self.token})}"

    def allowed_hosts(self) -> set[str]:
        return {f"127.0.0.1:{self.port}", f"localhost:{self.port}"}


class _Conn(socketserver.BaseRequestHandler):
    server: Forwarder
    request: socket.socket

    def handle(self) -> None:
        # Replies come in pieces (headers, then body; SSE messages): without this, Nagle's algorithm and
        # the browser's delayed ACK hold each second piece ~40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request.settimeout(HEAD_TIMEOUT_S)
        try:
            head = _read_head(self.request)
        except (OSError, UsageError):
            return
        verdict = check(head, self.server)
        if verdict is not None:
            self.request.sendall(verdict)
            return
        try:
            upstream = self.server.open_upstream()
        except OrchestratorError as exc:
            self.server.errors.append(str(exc))
            self.request.sendall(_reply(502, f"{exc}\n"))
            return
        self.request.settimeout(None)
        _pipe(self.request, upstream, head)


def check(head: bytes, fwd: Forwarder) -> bytes | None:
    """None when the request may pass; else the reply it gets (403, or the redirect that sets the cookie)."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        _method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        return _reply(400, "bad request line\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    if headers.get("host") not in fwd.allowed_hosts():
        return _reply(
            403,
            f"403: Host {headers.get('host', '')[:100]!r} is not this forwarder "
            f"({', '.join(sorted(fwd.allowed_hosts()))})\n",
        )
    url = urlsplit(target)
    query = parse_qsl(url.query, keep_blank_values=True)
    given = dict(query).get("token")
    if given is not None:
        if not hmac.compare_digest(given, fwd.token):
            return _reply(403, "403: wrong token: open the URL `orchestrator dashboard` printed\n")
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        location = (url.path or "/") + (f"?{rest}" if rest else "")
        return _reply(
            303,
            "",
            {"Location": location, "Set-Cookie": f"{fwd.cookie}={fwd.token}; Path=/; HttpOnly; SameSite=Strict"},
        )
    try:
        jar = SimpleCookie(headers.get("cookie", ""))
    except CookieError:
        jar = SimpleCookie()
    morsel = jar.get(fwd.cookie)
    if morsel is not None and hmac.compare_digest(morsel.value, fwd.token):
        return None
    return _reply(403, "403: no session token: open the URL `orchestrator dashboard` printed\n")


def _reply(status: int, text: str, headers: dict[str, str] | None = None) -> bytes:
    reason = {303: "See Other", 400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    body = text.encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "Cache-Control: no-store",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _read_head(sock: socket.socket) -> bytes:
    """The bytes read up to and past the end of the first request's headers (the rest is forwarded too)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            raise UsageError(f"request headers longer than {MAX_HEAD} bytes")
        chunk = sock.recv(_CHUNK)
        if not chunk:
            raise UsageError("closed before the request headers ended")
        buf += chunk
    return buf


def _pipe(client: socket.socket, upstream: Stream, first: bytes) -> None:
    """Both ways until either side closes; then both are closed. A far end that closes before its first
    byte (the relay found no agent, the agent went away) is a 502 saying why, not an empty reply."""

    def up() -> None:
        try:
            upstream.sendall(first)
            while data := client.recv(_CHUNK):
                upstream.sendall(data)
        except OSError:
            pass  # the other direction ends too (the dashboard drops an idle connection) and closes both

    threading.Thread(target=up, daemon=True).start()
    answered = False
    try:
        while True:
            try:
                data = upstream.recv(_CHUNK)
            except OSError:
                data = b""  # reset by the far end: closed, as far as the browser is concerned
            if not data:
                break
            answered = True
            client.sendall(data)
        if not answered:
            why = getattr(upstream, "failure", lambda: None)()
            client.sendall(
                _reply(502, f"the dashboard closed the connection without an answer{': ' + why if why else ''}\n")
            )
    except OSError:
        pass
    finally:
        upstream.close()
        try:
            client.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
