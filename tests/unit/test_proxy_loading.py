"""What a client reads through a real HAProxy (rendered config, loopback) for each kind of name: a name
being brought up is 503 + Retry-After "loading", a catalog name not loaded 503 "not loaded", and 404 is
left for names the host does not know."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import Route
from tests.builders.haproxy import Engine, free_port, haproxy, post, render_front

RETRY_AFTER_S = 4


@dataclass
class Front:
    port: int
    engine: Engine
    loading_engine: Engine


class Dies:
    """An engine killed under its request: accepts, reads the request, closes without an answer."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("loading")
    engine = Engine().start()
    loading_engine = Engine(body=b'{"error":{"message":"model is loading"}}', status=503).start()
    dies = Dies()
    port = free_port()
    routes = [
        Route("alpha", "127.0.0.1", engine.port),
        Route("beta", loading=True),
        Route("gamma"),
        Route("epsilon", "127.0.0.1", loading_engine.port),
        Route("zeta", "127.0.0.1", dies.port),
    ]
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(
        render_front(
            tmp,
            Proxy(enabled=True, port=port, retry_after_s=RETRY_AFTER_S),
            routes,
            known=["alpha", "beta", "gamma", "delta", "epsilon", "zeta"],
        )
    )
    with haproxy(cfg, port):
        yield Front(port, engine, loading_engine)
    engine.close()
    loading_engine.close()
    dies.sock.close()


def error(body: bytes) -> dict[str, str]:
    return dict(json.loads(body)["error"])


def test_a_name_being_brought_up_is_503_loading_with_retry_after(front: Front) -> None:
    """The name a first switch loads: 503, Retry-After, code model_loading, "is loading" in the message."""
    status, headers, body = post(front.port, "beta")
    assert (status, headers.get("retry-after")) == (503, str(RETRY_AFTER_S))
    assert error(body)["code"] == "model_loading" and "model beta is loading" in error(body)["message"]


def test_a_catalog_name_not_loaded_is_503_not_404(front: Front) -> None:
    """A name the host's catalog has but nothing serves or loads: 503 model_not_loaded (no Retry-After)."""
    status, headers, body = post(front.port, "delta")
    assert status == 503 and "retry-after" not in headers
    assert error(body)["code"] == "model_not_loaded" and "model delta is not loaded" in error(body)["message"]


def test_a_name_being_switched_keeps_its_503_switching(front: Front) -> None:
    """A stop-start gap still answers model_switching with Retry-After."""
    status, headers, body = post(front.port, "gamma")
    assert (status, headers.get("retry-after"), error(body)["code"]) == (503, str(RETRY_AFTER_S), "model_switching")


def test_only_an_unknown_name_is_404(front: Front) -> None:
    """A name the host does not know is 404 model_not_found; the serving one reaches its engine."""
    status, _, body = post(front.port, "nobody")
    assert status == 404 and error(body)["code"] == "model_not_found"
    assert post(front.port, "alpha")[0] == 200


def test_an_engines_own_503_gets_retry_after(front: Front) -> None:
    """An engine answering 503 itself (reloading after systemd restarted it): the client gets Retry-After too."""
    status, headers, body = post(front.port, "epsilon")
    assert (status, headers.get("retry-after")) == (503, str(RETRY_AFTER_S))
    assert error(body)["message"] == "model is loading"


def test_an_engine_that_dies_under_a_request_is_502_json_with_retry_after(front: Front) -> None:
    """The engine closes the connection without an answer (SIGKILLed mid-request): HAProxy's 502 comes
    as OpenAI-style JSON, code engine_gone, with Retry-After."""
    status, headers, body = post(front.port, "zeta")
    assert (status, headers.get("retry-after")) == (502, str(RETRY_AFTER_S))
    assert error(body)["code"] == "engine_gone"
