"""Turning one streamed OpenAI response into timings and token counts (pure, no I/O).

Timing rules follow ``vllm bench serve`` so both tools' figures compare: every event carrying
``choices`` is a token event (the first one, even with empty text, fixes TTFT; each later one adds
an inter-token gap); latency ends at the last token event; token counts come only from the
``usage`` event that ``stream_options.include_usage`` asks for, never from counting events.
Events that arrive in one network read share one timestamp, as in vLLM's client.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


class StreamError(Exception):
    """The stream cannot be used; ``kind`` is the error class counted in results."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request: success with timings and usage, or the kind of error it ended with."""

    ok: bool
    start: float
    end: float
    ttft: float = 0.0
    latency: float = 0.0
    itl: tuple[float, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_kind: str = ""
    error: str = ""

    @classmethod
    def failure(cls, start: float, end: float, kind: str, message: str) -> RequestOutcome:
        return cls(ok=False, start=start, end=end, error_kind=kind, error=message[:500])


class StreamAccumulator:
    """Feed it the raw body bytes of an SSE response as they arrive; ``finish`` gives the outcome."""

    __slots__ = ("_buf", "_done", "_first", "_itl", "_last", "_start", "_usage", "token_events")

    def __init__(self, start: float) -> None:
        self._start = start
        self._buf = b""
        self._first = -1.0
        self._last = start
        self._itl: list[float] = []
        self._usage: dict[str, object] | None = None
        self._done = False
        self.token_events = 0  # live progress only; results use usage

    def feed(self, data: bytes, now: float) -> int:
        """Consume bytes received at ``now``; returns how many token events they completed."""
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._buf = events.pop()  # an unfinished event waits for the next read
        before = self.token_events
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    self._data(line[5:].strip(), now)
        return self.token_events - before

    def _data(self, payload: bytes, now: float) -> None:
        if payload == b"[DONE]":
            self._done = True
            return
        try:
            obj = json.loads(payload.decode())  # str skips json's encoding sniffing: hot path
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            raise StreamError("bad_event", f"event is not JSON: {payload[:200]!r}") from exc
        if not isinstance(obj, dict):
            raise StreamError("bad_event", f"event is not a JSON object: {payload[:200]!r}")
        if obj.get("choices"):
            if self._first < 0:
                self._first = now
            else:
                self._itl.append(now - self._last)
            self._last = now
            self.token_events += 1
        elif isinstance(usage := obj.get("usage"), dict):
            self._usage = usage
        elif "error" in obj:
            raise StreamError("server_error", f"error event: {payload[:300]!r}")

    def finish(self, now: float) -> RequestOutcome:
        """The outcome once the body has ended; raises StreamError when it cannot be measured."""
        if not self._done:
            raise StreamError("truncated", "stream ended without data: [DONE]")
        if self._first < 0:
            raise StreamError("no_tokens", "stream carried no token event")
        if self._usage is None:
            raise StreamError("no_usage", "stream carried no usage event (stream_options.include_usage)")
        completion = self._usage.get("completion_tokens")
        prompt = self._usage.get("prompt_tokens", 0)
        if not isinstance(completion, int) or not isinstance(prompt, int):
            raise StreamError("no_usage", f"usage without integer token counts: {self._usage!r}")
        return RequestOutcome(
            ok=True,
            start=self._start,
            end=now,
            ttft=self._first - self._start,
            latency=self._last - self._start,
            itl=tuple(self._itl),
            prompt_tokens=prompt,
            completion_tokens=completion,
        )
