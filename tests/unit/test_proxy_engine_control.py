"""The front proxy never forwards vLLM's engine-control endpoints (sleep mode's /sleep, /wake_up,
/collective_rpc ... opened by VLLM_SERVER_DEV_MODE=1): a real HAProxy on loopback, from the rendered
config, answers 403 for each, however spelled, and the engine behind it never sees one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import ENGINE_CONTROL_PATHS, Route
from tests.builders.haproxy import Engine, free_port, haproxy, render_front, request

MODEL = "warm"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Engine]]:
    engine = Engine().start()
    port = free_port()
    tmp = tmp_path_factory.mktemp("haproxy")
    (tmp / "haproxy.cfg").write_text(
        render_front(tmp, Proxy(enabled=True, port=port), [Route(MODEL, "127.0.0.1", engine.port)])
    )
    with haproxy(tmp / "haproxy.cfg", port):
        yield port, engine
    engine.close()


def test_completions_still_reach_the_engine(front: tuple[int, Engine]) -> None:
    """The API itself is forwarded: a completion for the model reaches its engine."""
    port, engine = front
    assert request(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi"})[0] == 200
    assert "/v1/completions" in engine.paths()


@pytest.mark.parametrize("path", ENGINE_CONTROL_PATHS)
def test_every_engine_control_endpoint_is_403(front: tuple[int, Engine], path: str) -> None:
    """POST (with the model's name in the body) and GET of each endpoint answer 403; none reaches the engine."""
    port, engine = front
    for method in ("POST", "GET"):
        status, _, body = request(port, method, path + "?level=1", {"model": MODEL} if method == "POST" else None)
        assert status == 403 and json.loads(body)["error"]["code"] == "forbidden"
    assert not [p for p in engine.paths() if p.split("?")[0] == path]


@pytest.mark.parametrize(
    "path",
    [
        "/%73leep",
        "/SLEEP",
        "/Collective_RPC",
        "/wake_up/",
        "/wake%5Fup?tags=weights",
        "/%63ollective_rpc",
        "http://127.0.0.1/sleep?level=1",
    ],
)
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
