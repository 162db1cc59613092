"""The dashboard's HTTP server: read-only pages on a Unix socket, with the control socket's authorization.

No TCP port is opened: the socket is the only way in, and `orchestrator dashboard` forwards it (over the
CLI's SSH connection with --host) to a browser. The socket takes every local connection (mode 0666) and
reads the peer's uid from SO_PEERCRED before a byte of the request: root, the agent's user and members of
the socket group get pages; anyone else gets 403 naming their uid and the group. Only GET and HEAD.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from orchestrator import logs, unix_sockets
from orchestrator.contract.wire import peer_credentials
from orchestrator.dashboard.pages import Pages, Redirect
from orchestrator.errors import OrchestratorError
from orchestrator.unix_sockets import BoundedServer

log = logs.get_logger()

STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}
# Pages may load their own scripts and styles only: nothing inline, nothing from elsewhere.
CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'"
MAX_WATCHERS = 16  # open live pages at once; more get 503
MAX_CONNECTIONS = 64  # connections in service at once (live pages included); more get 503
TURN_AWAY_S = 1.0  # how long a turned-away client is listened to (overall), so it reads the 503


class _Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"
    timeout = 30.0  # an idle keep-alive connection is dropped

    def setup(self) -> None:
        super().setup()
        self.peer_uid: int | None = None

    def handle(self) -> None:
        _pid, uid, gid = peer_credentials(self.request)
        self.peer_uid = uid
        if not self.server.agent.authorized(uid, gid):
            log.warning("dashboard_refused", uid=uid, gid=gid)
            self.close_connection = True
            if self.handle_one_request_head():
                self._send(
                    HTTPStatus.FORBIDDEN,
                    "text/plain; charset=utf-8",
                    f"403: uid {uid} may not use the dashboard: only root and members of group "
                    f"{self.server.agent.group!r} may (the same as the agent's socket)\n".encode(),
                )
            return
        super().handle()

    def handle_one_request_head(self) -> bool:
        """Read the request line and headers only (to answer 403 as HTTP, not as a reset)."""
        self.raw_requestline = self.rfile.readline(65537)
        return bool(self.raw_requestline) and self.parse_request()

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/events":
                self._events(self.server.pages.sections)
                return
            if path == "/fleet/events" and self.server.live.fleet.is_controller():
                self._events(self.server.pages.fleet_sections)
                return
            if path.startswith("/static/"):
                self._static(path.removeprefix("/static/"))
                return
            page = self.server.pages.route(path)
        except OrchestratorError as exc:
            self._send(HTTPStatus.BAD_GATEWAY, "text/plain; charset=utf-8", f"error: {exc}\n".encode())
            return
        except Exception:  # the dashboard's top loop: a page that fails is answered, never a dropped connection
            log.exception("dashboard_page_failed", path=path[:200])
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                b"500: this page failed; the agent's log says why\n",
            )
            return
        if page is None:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", f"no page {path[:200]!r}\n".encode())
            return
        if isinstance(page, Redirect):
            self._send(HTTPStatus.SEE_OTHER, "text/plain; charset=utf-8", f"see {page}\n".encode(), location=page)
            return
        kind, body = page
        self._send(HTTPStatus.OK, kind, body)

    def _refuse_method(self) -> None:
        self.close_connection = True
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            f"{self.command}: the dashboard is read-only (GET and HEAD only)\n".encode(),
            allow="GET, HEAD",
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method

    def _static(self, name: str) -> None:
        ext = Path(name).suffix
        if "/" in name or name.startswith(".") or ext not in STATIC_TYPES:
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", f"no file {name[:200]!r}\n".encode())
            return
        file = resources.files("orchestrator.dashboard").joinpath("static", name)
        if not file.is_file():
            self._send(HTTPStatus.NOT_FOUND, "text/plain; charset=utf-8", f"no file {name[:200]!r}\n".encode())
            return
        self._send(HTTPStatus.OK, STATIC_TYPES[ext], file.read_bytes(), cache="max-age=3600")

    def _events(self, sections: Callable[[], dict[str, Any]]) -> None:
        """Server-sent events: the page's live sections as HTML (rendered by the same templates as the
        page), sent whenever the agent's view changes (a progress event) or every refresh_s."""
        live = self.server.live
        if not self.server.watch_slots.acquire(blocking=False):
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                f"the dashboard already serves {MAX_WATCHERS} live pages\n".encode(),
            )
            return
        live.watch(+1)
        self.close_connection = True
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Accel-Buffering", "no")
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command == "HEAD":
                return
            seen = -1
            while not self.server.stopping.is_set():
                seen = live.version
                try:
                    data = json.dumps(sections())
                except OrchestratorError as exc:
                    data = json.dumps({"error": str(exc)})
                self.wfile.write(f"event: sections\ndata: {data}\n\n".encode())
                self.wfile.flush()
                live.wait(seen, timeout=live.refresh_s)
        except OSError:
            pass  # the page was closed
        finally:
            live.watch(-1)
            self.server.watch_slots.release()

    def _send(
        self,
        status: HTTPStatus,
        kind: str,
        body: bytes,
        *,
        cache: str = "no-store",
        allow: str | None = None,
        location: str | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", cache)
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        if allow:
            self.send_header("Allow", allow)
        if location:
            self.send_header("Location", location)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def address_string(self) -> str:
        return f"uid {self.peer_uid}"  # a Unix socket peer has no address

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard_request", uid=self.peer_uid, line=format % args)


class DashboardServer(BoundedServer):
    """At most MAX_CONNECTIONS connections in service, each on its thread; one more is answered 503."""

    def __init__(self, path: str, agent: Any, pages: Pages) -> None:
        self.agent, self.pages, self.live = agent, pages, pages.live
        self.stopping = threading.Event()
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.overflow = threading.BoundedSemaphore(MAX_CONNECTIONS)  # clients being told "too many"
        self.watch_slots = threading.BoundedSemaphore(MAX_WATCHERS)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        unix_sockets.clear_stale(path, "dashboard socket")
        super().__init__(path, _Handler)
        self.bound = unix_sockets.bound(path)
        os.chmod(path, 0o666)  # every local user reaches it and is answered: 403 unless authorized

    def turn_away(self, request: socket.socket) -> None:
        log.warning("dashboard_turned_away", connections=MAX_CONNECTIONS)
        if self.overflow.acquire(blocking=False):  # answer it, briefly, off the accepting thread
            threading.Thread(target=self._tell_too_many, args=(request,), daemon=True).start()
        else:
            self.shutdown_request(request)

    def _tell_too_many(self, request: socket.socket) -> None:
        """503, then read what the client sent for a moment: closing on its unread request would reset
        the connection before it reads the answer."""
        body = f"the dashboard already serves {MAX_CONNECTIONS} connections; try again\n".encode()
        try:
            request.settimeout(TURN_AWAY_S)
            request.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + TURN_AWAY_S
            while (left := deadline - time.monotonic()) > 0:
                request.settimeout(left)
                if not request.recv(65536):
                    break
        except OSError:
            pass
        finally:
            self.shutdown_request(request)
            self.overflow.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("dashboard_error")

    def close(self) -> None:
        self.stopping.set()
        self.live.stop()
        self.shutdown()
        self.server_close()
        unix_sockets.remove(self.bound)
