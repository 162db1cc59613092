"""A real HAProxy on loopback from the rendered config, and loopback engines behind it: what the proxy
unit tests share (each file one module-scoped front of its own routes)."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from orchestrator.adapters import haproxy_master
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import parse_show_proc
from orchestrator.core.proxy import DEMAND_LUA, Route, render_config
from orchestrator.resources import template_text
from tests.hosts.wait import wait_for

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Asked:
    at: float  # time.monotonic() when it came
    path: str
    model: str | None  # the JSON body's "model", if any
    size: int = 0  # the body's length in bytes, as read


class Engine(ThreadingHTTPServer):
    """A loopback stand-in for vLLM, serving from ``start``: answers every GET and POST ``status`` ``body``
    once ``release`` is set (set from the start: clear it to hold answers), recording each request."""

    def __init__(self, address: str = "127.0.0.1", body: bytes = b'{"ok":true}', status: int = 200) -> None:
        self.seen: list[Asked] = []
        self.body = body
        self.status = status
        self.release = threading.Event()
        self.release.set()
        self.address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        super().__init__((address, 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def paths(self) -> list[str]:
        return [a.path for a in self.seen]

    def start(self) -> Self:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Engine

    def _answer(self) -> None:
        raw = (
            self._chunked()
            if "chunked" in self.headers.get("Transfer-Encoding", "")
            else self.rfile.read(int(self.headers.get("Content-Length") or 0))
        )
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        self.server.seen.append(Asked(time.monotonic(), self.path, None if model is None else str(model), len(raw)))
        self.server.release.wait(30)
        out = self.server.body
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _chunked(self) -> bytes:
        out = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            out += self.rfile.read(size)
            self.rfile.readline()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return out

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def render_front(tmp: Path, proxy: Proxy, routes: list[Route], **demand: Any) -> str:
    """The shipped template's config for ``routes`` (``demand``: render_config's demand keywords), with
    this run's own admin socket and Lua path under ``tmp`` (the shipped ones are the box's): parallel
    runs stay apart."""
    config = render_config(proxy, "127.0.0.1", routes, template_text("haproxy.cfg.j2"), **demand)
    return config.replace('"/run/orchestrator-proxy/admin.sock"', f'"{tmp}/admin.sock"').replace(
        f'"/etc/orchestrator/{DEMAND_LUA}"', f'"{tmp}/{DEMAND_LUA}"'
    )


@contextmanager
def haproxy(cfg: Path, port: int, master_sock: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy on ``cfg`` (master-worker with its master CLI on ``master_sock`` when given) until it
    listens on ``port``; terminated after the block."""
    master = ["-W", "-S", f"{master_sock},mode,600"] if master_sock is not None else []
    errors = cfg.with_suffix(".stderr")  # a file, not a pipe: a long run's reload warnings never fill it
    with errors.open("wb") as err:
        proc = subprocess.Popen([HAPROXY, *master, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=err)

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            assert proc.poll() is None, f"HAProxy exited: {errors.read_text(errors='replace')}"
            return False

    def master_up() -> bool:
        """The master answers `show proc` with a worker: a connectable port does not say its CLI answers
        yet (seen on a loaded machine: no answer right after the port opened)."""
        assert master_sock is not None
        procs = parse_show_proc(haproxy_master.ask(str(master_sock), "show proc") or "")
        return procs is not None and bool(procs.workers)

    try:
        wait_for(listening, what=f"HAProxy listening on 127.0.0.1:{port}")
        if master_sock is not None:
            wait_for(master_up, what=f"HAProxy's master CLI on {master_sock} with a worker")
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def post(port: int, model: str, *, timeout: float = 30, **fields: Any) -> tuple[int, dict[str, str], bytes]:
    """A completion through the proxy: (status, headers in lower case, body)."""
    return request(port, "POST", "/v1/completions", {"model": model, "prompt": "hi", **fields}, timeout=timeout)


def request(
    port: int, method: str, path: str, body: dict[str, object] | None = None, *, timeout: float = 10
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    answer = conn.getresponse()
    out = answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    conn.close()
    return out
