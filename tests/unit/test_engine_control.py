"""HttpEngineControl against a real HTTP server on loopback that answers as vLLM 0.25's sleep API."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import pytest

from orchestrator.adapters.engine_http import HttpEngineControl
from orchestrator.errors import EngineError


@dataclass
class Script:
    """What the server answers, by path; and what it was asked."""

    answers: dict[str, tuple[int, str]] = field(default_factory=dict)
    asked: list[tuple[str, str, dict[str, list[str]], str]] = field(default_factory=list)
    hang: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def engine() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            url = urlsplit(self.path)
            size = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(size).decode() if size else ""
            script.asked.append((self.command, url.path, parse_qs(url.query), body))
            if url.path == "/v1/completions" and script.hang.is_set():
                threading.Event().wait(5)  # vLLM half-woken: the request gets no answer
            status, text = script.answers.get(url.path, (200, ""))
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()


def test_sleep_posts_level_and_mode(engine: tuple[str, Script]) -> None:
    """sleep() posts /sleep with the level and mode as query parameters (vLLM 0.25's API)."""
    url, script = engine
    HttpEngineControl().sleep(url, 1, "wait")
    assert script.asked == [("POST", "/sleep", {"level": ["1"], "mode": ["wait"]}, "")]


def test_wake_with_tags_posts_each_tag(engine: tuple[str, Script]) -> None:
    """wake() with tags repeats tags= (level 2 wakes weights, then kv_cache); without tags it sends none."""
    url, script = engine
    control = HttpEngineControl()
    control.wake(url, ("weights",))
    control.wake(url)
    assert [(a[1], a[2]) for a in script.asked] == [("/wake_up", {"tags": ["weights"]}), ("/wake_up", {})]


def test_wake_error_carries_the_engines_status_and_body(engine: tuple[str, Script]) -> None:
    """A 500 from /wake_up raises EngineError with vLLM's own words, status and body."""
    url, script = engine
    words = '{"error":{"message":"Call to wake_up method failed: CUDA Error: out of memory"}}'
    script.answers["/wake_up"] = (500, words)
    with pytest.raises(EngineError) as info:
        HttpEngineControl().wake(url)
    assert (info.value.status, info.value.body) == (500, words)
    assert "HTTP 500" in str(info.value) and "CUDA Error: out of memory" in str(info.value)


@pytest.mark.parametrize(("answer", "expected"), [('{"is_sleeping": true}', True), ('{"is_sleeping": false}', False)])
def test_is_sleeping_reads_the_flag(engine: tuple[str, Script], answer: str, expected: bool) -> None:
    """is_sleeping() is the engine's is_sleeping flag."""
    url, script = engine
    script.answers["/is_sleeping"] = (200, answer)
    assert HttpEngineControl().is_sleeping(url) is expected


@pytest.mark.parametrize("answer", ['{"is_sleeping": "no"}', "{}", "not json"])
def test_is_sleeping_refuses_a_malformed_answer(engine: tuple[str, Script], answer: str) -> None:
    """An answer without a boolean is_sleeping is an error that quotes it, never read as awake."""
    url, script = engine
    script.answers["/is_sleeping"] = (200, answer)
    with pytest.raises(EngineError, match="is_sleeping"):
        HttpEngineControl().is_sleeping(url)


def test_is_sleeping_404_names_the_status(engine: tuple[str, Script]) -> None:
    """Without VLLM_SERVER_DEV_MODE the endpoint is 404: the error says so with the status."""
    url, script = engine
    script.answers["/is_sleeping"] = (404, '{"detail":"Not Found"}')
    with pytest.raises(EngineError) as info:
        HttpEngineControl().is_sleeping(url)
    assert info.value.status == 404 and "Not Found" in str(info.value)


def test_reload_weights_calls_collective_rpc(engine: tuple[str, Script]) -> None:
    """reload_weights() posts collective_rpc with method reload_weights (vLLM's level-2 wake)."""
    url, script = engine
    HttpEngineControl().reload_weights(url)
    assert [(a[1], json.loads(a[3])) for a in script.asked] == [("/collective_rpc", {"method": "reload_weights"})]


def test_completion_that_does_not_answer_in_time_is_an_error(engine: tuple[str, Script]) -> None:
    """complete() gives up after its timeout with an EngineError that says there was no answer."""
    url, script = engine
    script.hang.set()
    with pytest.raises(EngineError, match="no answer") as info:
        HttpEngineControl().complete(url, "m", timeout=0.2)
    assert info.value.status is None


def test_unreachable_engine_is_an_error_naming_the_url() -> None:
    """A refused connection raises EngineError naming the URL and path."""
    with pytest.raises(EngineError, match=r"127\.0\.0\.1:9/sleep"):
        HttpEngineControl().sleep("http://127.0.0.1:9", 1)


@pytest.mark.parametrize(("level", "mode"), [(3, "wait"), (1, "later")])
def test_bad_level_or_mode_is_refused_before_any_request(engine: tuple[str, Script], level: int, mode: str) -> None:
    """A level other than 1/2 or an unknown mode is refused, naming the value, and nothing is sent."""
    url, script = engine
    with pytest.raises(EngineError, match=repr(mode) if level == 1 else "level 3"):
        HttpEngineControl().sleep(url, level, mode)
    assert script.asked == []
