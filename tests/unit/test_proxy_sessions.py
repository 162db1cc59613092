"""The proxy's sessions per engine through HAProxy's master CLI (adapters/haproxy.py `sessions`): a
real HAProxy in master-worker mode on loopback, from the rendered config, in front of a loopback HTTP
server that holds a request until told. What the idle loop of models on demand reads."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.core.catalog import Proxy
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.proxy import Route, render_config
from orchestrator.resources import template_text
from tests.hosts.wait import wait_for

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


class Engine(ThreadingHTTPServer):
    """Answers each request once ``release`` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Engine

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.release.wait(30)
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Engine, Engine, HaproxyProxy]]:
    busy, quiet = Engine(), Engine()
    for e in (busy, quiet):
        threading.Thread(target=e.serve_forever, daemon=True).start()
    port = _free_port()
    tmp: Path = tmp_path_factory.mktemp("haproxy")
    routes = [Route("busy", "127.0.0.1", busy.server_address[1]), Route("quiet", "127.0.0.1", quiet.server_address[1])]
    config = render_config(Proxy(enabled=True, port=port), "127.0.0.1", routes, template_text("haproxy.cfg.j2"))
    config = config.replace('"/run/orchestrator-proxy/admin.sock"', f'"{tmp}/admin.sock"')
    (tmp / "haproxy.cfg").write_text(config)
    proc = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(tmp / "haproxy.cfg"), "-S", f"{tmp}/master.sock,mode,600"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
    # the shipped socket paths are the box's; this run's own (not a valid deploy.toml value) keeps runs apart
    proxy = Proxy.model_construct(**{**Proxy().model_dump(), "enabled": True, "port": port,
                                     "stats_socket": f"{tmp}/admin.sock"})
    adapter = HaproxyProxy(LocalShell(), None, proxy, "127.0.0.1", "", python=sys.executable)  # type: ignore[arg-type]
    yield port, busy, quiet, adapter
    busy.release.set()
    proc.terminate()
    proc.wait(10)
    busy.shutdown()
    quiet.shutdown()


def _post(port: int, model: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": model, "prompt": "x"}),
                 {"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_request_in_flight_counts_and_an_engine_never_asked_has_no_last_session(
        front: tuple[int, Engine, Engine, HaproxyProxy]) -> None:
    """One request held by the busy engine: 1 session there; the quiet one: 0 and no last session."""
    port, busy, quiet, adapter = front
    engines = [("127.0.0.1", busy.server_address[1]), ("127.0.0.1", quiet.server_address[1])]
    results: list[int] = []
    client = threading.Thread(target=lambda: results.append(_post(port, "busy")))
    client.start()
    seen = wait_for(lambda: adapter.sessions(engines), lambda s: s.get(engines[0], Sessions(0, None)).current == 1,
                    timeout=20, what="the held request counted by HAProxy")
    assert seen[engines[1]] == Sessions(0, None, 0)
    busy.release.set()
    client.join(30)
    assert results == [200]
    after = wait_for(lambda: adapter.sessions(engines), lambda s: s[engines[0]].current == 0, timeout=20,
                     what="the finished request no longer counted")
    idle = after[engines[0]].idle_s
    assert idle is not None and idle >= 0 and after[engines[0]].total == 1
