"""Routing reads the whole body, whatever the order of its keys: a real HAProxy on loopback, from the
rendered config, routes a 1 MB prompt whose ``model`` comes last (as clients that sort keys send it)
to its own engine, up to the body limit the host's max_model_len gives; past that limit a body whose
model it could not read is a 413 naming the limit, never a wrong 404."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import (
    BODY_BYTES_PER_TOKEN,
    BODY_MARGIN,
    DEFAULT_CONTEXT_TOKENS,
    MAX_BODY,
    Route,
    body_limit,
    host_body_limit,
)
from tests.builders.haproxy import Engine, free_port, haproxy, render_front
from tests.builders.toml import LOCAL_PROXY_BOX

MAX_MODEL_LEN = 131_072  # the larger of the two models' context: the limit derives from it
LIMIT = body_limit([MAX_MODEL_LEN, 32_768])
MODELS = ("chat", "code")

Front = tuple[int, dict[str, Engine]]


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    engines = {name: Engine().start() for name in MODELS}
    port = free_port()
    tmp = tmp_path_factory.mktemp("haproxy")
    routes = [Route(name, "127.0.0.1", e.port) for name, e in engines.items()]
    (tmp / "haproxy.cfg").write_text(render_front(tmp, Proxy(enabled=True, port=port), routes, body=LIMIT))
    with haproxy(tmp / "haproxy.cfg", port):
        yield port, engines
    for e in engines.values():
        e.close()


def model_last(model: str, size: int) -> bytes:
    """A chat request of ``size`` bytes serialized with sorted keys: ``messages`` before ``model``."""
    frame = json.dumps({"messages": [{"role": "user", "content": ""}], "model": model}, sort_keys=True)
    body = json.dumps(
        {"messages": [{"role": "user", "content": "x" * (size - len(frame))}], "model": model}, sort_keys=True
    ).encode()
    assert len(body) == size and body.index(b'"model"') > size - 30
    return body


def send(port: int, body: bytes, *, chunked: bool = False) -> tuple[int, dict[str, object]]:
    """POST ``body`` through the proxy (with Content-Length, or chunked in 64 KiB pieces): (status, JSON answer)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if chunked:
        pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
        conn.request("POST", "/v1/chat/completions", body=pieces, headers=headers, encode_chunked=True)
    else:
        conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    answer = conn.getresponse()
    out = answer.status, json.loads(answer.read())
    conn.close()
    return out


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("model", MODELS)
def test_a_1mb_prompt_with_model_last_reaches_its_engine(front: Front, model: str, chunked: bool) -> None:
    """1 MB with ``model`` as the last key routes to that model's engine, which gets the whole body."""
    port, engines = front
    body = model_last(model, 1_000_000)
    assert send(port, body, chunked=chunked)[0] == 200
    asked = engines[model].seen[-1]
    assert (asked.model, asked.size) == (model, len(body))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_past_the_buffer_with_model_last_is_413_naming_the_limit(front: Front, chunked: bool) -> None:
    """Longer than HAProxy's buffer, ``model`` last: 413 in OpenAI's error shape naming the limit; no engine sees it."""
    port, engines = front
    before = {name: len(e.seen) for name, e in engines.items()}
    status, answer = send(port, model_last("chat", LIMIT.bufsize + 1), chunked=chunked)
    assert status == 413, answer
    error = answer["error"]
    assert isinstance(error, dict) and error["code"] == "request_too_large"
    assert f"{LIMIT.bytes:,} bytes" in error["message"] and f"{MAX_MODEL_LEN:,}" in error["message"]
    assert {name: len(e.seen) for name, e in engines.items()} == before


def test_a_body_over_the_limit_with_model_first_still_routes(front: Front) -> None:
    """The limit bounds only what routing reads: a larger body naming its model first still reaches the engine."""
    port, engines = front
    body = json.dumps({"model": "code", "prompt": "x" * (LIMIT.bytes + 100_000)}).encode()
    assert send(port, body)[0] == 200
    assert (engines["code"].seen[-1].model, engines["code"].seen[-1].size) == ("code", len(body))


def test_an_unknown_model_last_in_a_large_body_is_still_404(front: Front) -> None:
    """A model the proxy could read but does not serve keeps OpenAI's 404, however late it came."""
    port, _ = front
    status, answer = send(port, model_last("nope", 500_000))
    error = answer["error"]
    assert status == 404 and isinstance(error, dict) and error["code"] == "model_not_found"


def test_the_limit_derives_from_the_largest_max_model_len_on_the_host(tmp_path: Path) -> None:
    """The largest max_model_len of the host's models sets the limit, at 8 bytes a token plus the margin."""
    cat = LOCAL_PROXY_BOX.load(tmp_path, state=str(tmp_path), beta="max_model_len = 1048576")
    assert host_body_limit(cat, "box") == body_limit([1_048_576])
    assert body_limit([1_048_576]).bytes == 1_048_576 * BODY_BYTES_PER_TOKEN + BODY_MARGIN


def test_a_model_without_max_model_len_counts_as_the_default_context(tmp_path: Path) -> None:
    """vLLM then takes the model's own context, which the catalog does not know: the default stands in for it."""
    cat = LOCAL_PROXY_BOX.load(tmp_path, state=str(tmp_path), beta="max_model_len = 4096")
    assert host_body_limit(cat, "box").tokens == DEFAULT_CONTEXT_TOKENS


def test_the_limit_is_capped() -> None:
    """A huge max_model_len cannot make HAProxy's buffer unbounded: the limit stops at MAX_BODY."""
    assert body_limit([2**31 - 1]).bytes == MAX_BODY
