"""A client through the front proxy, as the GPU-box scenario's witness: standard library only.

A 2-token completion starts every 50 ms and a 64-token stream every second, each on its own connection and
thread, whatever the ones before are doing (a held request does not delay the next), each with a 120 s
read timeout. Every request is kept: kind, start and end (monotonic), HTTP status or the exception's name,
Retry-After, tokens, finish_reason, whether a stream ended with [DONE].

A request *failed* when it got neither 200 nor 503 with Retry-After; a stream is *cut* when it answered 200
without [DONE], with a finish_reason other than "length" (vLLM's sleep with mode=abort ends streams with
"abort"), or with fewer tokens than asked by the usage chunk (stream_options.include_usage: one SSE event
may carry several tokens, so events are not tokens); a request *hung* when it took more
than 30 s. The gap of a window is the longest time between two 200 answers of plain requests (one held
through a wake counts as down until it answers).
"""

from __future__ import annotations

import http.client
import itertools
import json
import threading
import time
from typing import Any

STREAM_TOKENS = 64
HUNG_S = 30.0


class Prober:
    def __init__(self, host: str, port: int, model: str, plain_every: float = 0.05, stream_every: float = 1.0):
        self.host, self.port, self.model = host, port, model
        self.plain_every, self.stream_every = plain_every, stream_every
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._inflight = threading.Semaphore(400)  # a bound on threads if the proxy stops answering

    # -- requests -------------------------------------------------------------------------------------------
    def _request(self, kind: str) -> None:
        stream = kind == "stream"
        tokens = STREAM_TOKENS if stream else 2
        rec: dict[str, Any] = {
            "kind": kind,
            "t0": time.monotonic(),
            "status": None,
            "retry_after": None,
            "tokens": 0,
            "finish": None,
            "done": False,
        }
        body = {"model": self.model, "prompt": "hi", "max_tokens": tokens, "stream": stream, "ignore_eos": True}
        if stream:  # the last chunk carries the token count: one SSE event may hold several tokens
            body["stream_options"] = {"include_usage": True}
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            rec["status"], rec["retry_after"] = resp.status, resp.getheader("Retry-After")
            if resp.status != 200 or not stream:
                data = resp.read()
                if resp.status == 200:
                    choice = json.loads(data)["choices"][0]
                    rec["tokens"], rec["finish"], rec["done"] = tokens, choice.get("finish_reason"), True
                else:
                    rec["body"] = data[:300].decode("utf-8", "replace")
            else:
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        rec["done"] = True
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        rec["usage_tokens"] = chunk["usage"].get("completion_tokens")
                    for choice in chunk.get("choices") or []:
                        rec["tokens"] += 1
                        rec["finish"] = choice.get("finish_reason") or rec["finish"]
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
            rec["status"] = rec["status"] or type(exc).__name__
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            conn.close()
            rec["t1"] = time.monotonic()
            with self._lock:
                self.records.append(rec)
            self._inflight.release()

    def _loop(self, kind: str, every: float) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            if self._inflight.acquire(timeout=every):
                t = threading.Thread(target=self._request, args=(kind,), daemon=True)
                t.start()
                self._threads.append(t)
            nxt += every
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    # -- control --------------------------------------------------------------------------------------------
    def start(self) -> Prober:
        for kind, every in (("plain", self.plain_every), ("stream", self.stream_every)):
            threading.Thread(target=self._loop, args=(kind, every), daemon=True).start()
        return self

    def stop(self, wait_s: float = 150.0) -> list[dict[str, Any]]:
        """No new requests; wait for the ones in flight (a hung one ends at its timeout)."""
        self._stop.set()
        deadline = time.monotonic() + wait_s
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            return sorted(self.records, key=lambda r: r["t0"])


def classify(rec: dict[str, Any]) -> str:
    """ok, 503 (with Retry-After), not_loaded (503: nothing serves the name and no switch to it has begun), cut,
    failed, or hung."""
    if rec["t1"] - rec["t0"] > HUNG_S:
        return "hung"
    if rec["status"] == 503 and rec.get("retry_after"):
        return "503"
    if rec["status"] == 503 and '"model_not_loaded"' in rec.get("body", ""):
        return "not_loaded"
    if rec["status"] != 200:
        return "failed"
    if rec["kind"] == "stream":
        # vLLM may put several tokens in one SSE event: the usage chunk's count, when sent, is the truth
        full = rec.get("usage_tokens") is None or rec["usage_tokens"] >= STREAM_TOKENS
        if not (rec["done"] and rec["finish"] == "length" and full):
            return "cut"
    return "ok"


def summarise(records: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Counts of the requests that started in [t0, t1], and the longest gap between 200 answers there."""
    window = [r for r in records if t0 <= r["t0"] <= t1]
    counts: dict[str, int] = {"ok": 0, "503": 0, "not_loaded": 0, "cut": 0, "failed": 0, "hung": 0}
    for r in window:
        counts[classify(r)] += 1
    oks = sorted(r["t1"] for r in records if r["kind"] == "plain" and r["status"] == 200 and t0 <= r["t1"] <= t1 + 60)
    gaps = [b - a for a, b in itertools.pairwise(oks) if a <= t1]
    statuses: dict[str, int] = {}
    for r in window:
        if classify(r) in ("failed", "cut", "hung"):
            statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"requests": len(window), **counts, "gap_ms": round(max(gaps, default=0.0) * 1000), "bad_statuses": statuses}
