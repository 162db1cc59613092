"""The front proxy never forwards vLLM's engine-control endpoints (sleep mode's /sleep, /wake_up,
/collective_rpc ... opened by VLLM_SERVER_DEV_MODE=1): a real HAProxy on loopback, from the rendered
config, answers 403 for each, however spelled, and the engine behind it never sees one."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import ENGINE_CONTROL_PATHS, Route, render_config
from orchestrator.resources import template_text

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
MODEL = "warm"


class Engine(ThreadingHTTPServer):
    """A loopback HTTP server standing in for vLLM: answers 200 and records every path it got."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Engine

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.server.seen.append(self.path)
        body = b'{"ok":true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Engine]]:
    engine = Engine()
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    port = _free_port()
    tmp = tmp_path_factory.mktemp("haproxy")
    config = render_config(Proxy(enabled=True, port=port), "127.0.0.1",
                           [Route(MODEL, "127.0.0.1", engine.server_address[1])], template_text("haproxy.cfg.j2"))
    # The shipped socket path is the box's; this process's own keeps parallel runs apart.
    config = config.replace('"/run/orchestrator-proxy/admin.sock"', f'"{tmp}/admin.sock"')
    (tmp / "haproxy.cfg").write_text(config)
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(tmp / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:  # until HAProxy listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
            time.sleep(0.05)
    yield port, engine
    proc.terminate()
    proc.wait(10)
    engine.shutdown()


def request(port: int, method: str, path: str, body: dict[str, object] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    answer = conn.getresponse()
    out = answer.status, answer.read()
    conn.close()
    return out


def test_completions_still_reach_the_engine(front: tuple[int, Engine]) -> None:
    """The API itself is forwarded: a completion for the model reaches its engine."""
    port, engine = front
    assert request(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi"})[0] == 200
    assert "/v1/completions" in engine.seen


@pytest.mark.parametrize("path", ENGINE_CONTROL_PATHS)
def test_every_engine_control_endpoint_is_403(front: tuple[int, Engine], path: str) -> None:
    """POST (with the model's name in the body) and GET of each endpoint answer 403; none reaches the engine."""
    port, engine = front
    for method in ("POST", "GET"):
        status, body = request(port, method, path + "?level=1", {"model": MODEL} if method == "POST" else None)
        assert status == 403 and json.loads(body)["error"]["code"] == "forbidden"
    assert not [p for p in engine.seen if p.split("?")[0] == path]


@pytest.mark.parametrize("path", ["/%73leep", "/SLEEP", "/Collective_RPC", "/wake_up/", "/wake%5Fup?tags=weights",
                                  "/%63ollective_rpc", "http://127.0.0.1/sleep?level=1"])
def test_encoded_or_cased_spellings_are_403(front: tuple[int, Engine], path: str) -> None:
    """uvicorn decodes %XX before routing: an encoded, upper-case or absolute-form spelling is refused the same way."""
    port, engine = front
    before = len(engine.seen)
    assert request(port, "POST", path, {"model": MODEL})[0] == 403
    assert len(engine.seen) == before


def test_a_path_that_does_not_decode_is_400(front: tuple[int, Engine]) -> None:
    """A bad percent-escape could hide a name from the check: refused with 400 before routing."""
    port, engine = front
    before = len(engine.seen)
    assert request(port, "POST", "/%73leep%zz", {"model": MODEL})[0] == 400
    assert len(engine.seen) == before
