"""Reading one streamed OpenAI response into timings and usage, with vLLM bench's rules."""

from __future__ import annotations

import json

import pytest

from orchestrator.loadgen.sse import StreamAccumulator, StreamError


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def token(text: str = "x") -> bytes:
    return event({"id": "cmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": None}]})


USAGE = event(
    {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 42, "total_tokens": 49}}
)
DONE = b"data: [DONE]\n\n"


def test_token_counts_come_from_usage_not_from_events() -> None:
    """Two token events and a usage chunk saying 42 give 42 completion tokens."""
    acc = StreamAccumulator(start=10.0)
    acc.feed(token() + token(), 10.5)
    acc.feed(USAGE + DONE, 10.6)
    out = acc.finish(10.7)
    assert (out.ok, out.prompt_tokens, out.completion_tokens) == (True, 7, 42)


def test_ttft_itl_and_latency_follow_token_events() -> None:
    """TTFT is the first token event; ITL the gaps between token events; latency ends at the last one."""
    acc = StreamAccumulator(start=1.0)
    acc.feed(token(""), 1.5)
    acc.feed(token(), 1.75)
    acc.feed(token(), 2.0)
    acc.feed(USAGE + DONE, 3.0)
    out = acc.finish(3.0)
    assert (out.ttft, out.itl, out.latency) == (0.5, (0.25, 0.25), 1.0)


def test_an_event_split_across_reads_is_parsed_once_complete() -> None:
    """Bytes of one event arriving in two reads make one token event, stamped when it completes."""
    acc = StreamAccumulator(start=0.0)
    raw = token()
    assert (acc.feed(raw[:9], 1.0), acc.feed(raw[9:], 2.0)) == (0, 1)


def test_crlf_line_endings_are_accepted() -> None:
    """SSE allows CRLF; events separated by blank CRLF lines count too."""
    acc = StreamAccumulator(start=0.0)
    acc.feed((token() + USAGE + DONE).replace(b"\n", b"\r\n"), 1.0)
    assert acc.finish(1.0).completion_tokens == 42


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (token() + USAGE, "truncated"),
        (USAGE + DONE, "no_tokens"),
        (token() + DONE, "no_usage"),
    ],
)
def test_unusable_streams_name_their_error_kind(body: bytes, kind: str) -> None:
    """A stream without [DONE], without tokens or without usage fails with that kind."""
    acc = StreamAccumulator(start=0.0)
    acc.feed(body, 1.0)
    with pytest.raises(StreamError) as err:
        acc.finish(1.0)
    assert err.value.kind == kind


def test_an_event_that_is_not_json_is_a_bad_event() -> None:
    """Garbage after data: is reported as bad_event with the payload in the message."""
    acc = StreamAccumulator(start=0.0)
    with pytest.raises(StreamError, match="garbage") as err:
        acc.feed(b"data: garbage\n\n", 1.0)
    assert err.value.kind == "bad_event"


def test_an_error_event_mid_stream_is_a_server_error() -> None:
    """vLLM reports engine failures inside the stream as an error object."""
    acc = StreamAccumulator(start=0.0)
    with pytest.raises(StreamError) as err:
        acc.feed(token() + event({"error": {"message": "engine dead", "code": 500}}), 1.0)
    assert err.value.kind == "server_error"
