"""`orchestrator dashboard`'s local port: only this session's browser gets through to the box.

A real Forwarder on 127.0.0.1 in front of the real dashboard socket (the agent in this process over
fake ports); requests are raw HTTP, as any local process could send them."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.client.forward import Forwarder, unix_opener
from orchestrator.dashboard.service import start

from .conftest import OpsWorld


@pytest.fixture
def fwd(tmp_path: Path) -> Iterator[Forwarder]:
    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(tmp_path / "dash.sock")})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    forwarder = Forwarder(unix_opener(str(tmp_path / "dash.sock")))
    threading.Thread(target=forwarder.serve_forever, daemon=True).start()
    yield forwarder
    forwarder.shutdown()
    forwarder.server_close()
    server.close()


def send(fwd: Forwarder, target: str, *, host: str | None = None, cookie: str | None = None) -> str:
    """One raw request to the forwarder; the whole reply as text."""
    lines = [f"GET {target} HTTP/1.1", f"Host: {host or f'127.0.0.1:{fwd.port}'}", "Connection: close"]
    if cookie is not None:
        lines.append(f"Cookie: {cookie}")
    with socket.create_connection(("127.0.0.1", fwd.port), timeout=30) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


def test_the_printed_url_sets_the_session_cookie_and_drops_the_token(fwd: Forwarder) -> None:
    """The URL's token is exchanged for an HttpOnly, SameSite=Strict cookie and a redirect without it."""
    reply = send(fwd, f"/?token={fwd.token}")
    assert reply.startswith("HTTP/1.1 303")
    assert "Location: /\r\n" in reply
    assert f"Set-Cookie: {fwd.cookie}={fwd.token}; Path=/; HttpOnly; SameSite=Strict" in reply


def test_the_session_cookie_reaches_the_dashboard(fwd: Forwarder) -> None:
    """With the cookie, the request is forwarded and the box page comes back."""
    reply = send(fwd, "/", cookie=f"{fwd.cookie}={fwd.token}")
    assert reply.startswith("HTTP/1.1 200") and 'class="gpus"' in reply


@pytest.mark.parametrize(
    ("target", "cookie", "why"),
    [
        ("/", None, "no session token"),
        ("/?token=guess", None, "wrong token"),
        ("/api/box", "orchestrator_dashboard_1=x", "no session token"),
    ],
)
def test_another_local_user_without_the_token_gets_403(
    fwd: Forwarder, target: str, cookie: str | None, why: str
) -> None:
    """The loopback port is open to every local user: without this session's token nothing is forwarded."""
    reply = send(fwd, target, cookie=cookie)
    assert reply.startswith("HTTP/1.1 403") and why in reply and "<table" not in reply


def test_a_foreign_host_header_is_refused(fwd: Forwarder) -> None:
    """A page on another site that resolves its name to 127.0.0.1 (DNS rebinding) gets 403, token or not."""
    reply = send(fwd, "/", host=f"evil.example:{fwd.port}", cookie=f"{fwd.cookie}={fwd.token}")
    assert reply.startswith("HTTP/1.1 403") and "evil.example" in reply


def test_the_forwarder_listens_on_loopback_only(fwd: Forwarder) -> None:
    """The local end binds 127.0.0.1, never a routable address."""
    assert fwd.server_address[0] == "127.0.0.1"
    assert fwd.url.startswith(f"http://127.0.0.1:{fwd.port}/?token=")


def test_an_unreachable_dashboard_is_a_502_naming_the_socket(tmp_path: Path) -> None:
    """No socket at the far end: the browser gets 502 naming the socket, and the command keeps the error."""
    forwarder = Forwarder(unix_opener(str(tmp_path / "missing.sock")))
    threading.Thread(target=forwarder.serve_forever, daemon=True).start()
    try:
        reply = send(forwarder, "/", cookie=f"{forwarder.cookie}={forwarder.token}")
    finally:
        forwarder.shutdown()
        forwarder.server_close()
    assert reply.startswith("HTTP/1.1 502") and "missing.sock" in reply
    assert forwarder.errors and "missing.sock" in forwarder.errors[0]


def test_a_stream_closed_without_an_answer_is_a_502_saying_why(tmp_path: Path) -> None:
    """The far end closes before answering (the relay found no agent): 502 with its reason, not an empty reply."""
    path = str(tmp_path / "closing.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()

    def close_each() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    forwarder = Forwarder(unix_opener(path))
    threading.Thread(target=forwarder.serve_forever, daemon=True).start()
    try:
        reply = send(forwarder, "/", cookie=f"{forwarder.cookie}={forwarder.token}")
    finally:
        forwarder.shutdown()
        forwarder.server_close()
        listener.close()
    assert reply.startswith("HTTP/1.1 502") and "closed the connection without an answer" in reply
