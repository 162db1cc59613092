#!/usr/bin/env python3
"""A client-side prober for the front proxy: plain and streaming completions, continuously.

Runs as its own process (a client, not part of the test's process): STREAMS workers each loop on
streaming completions of TOKENS tokens, PLAIN workers on 2-token plain completions, every worker on
its own keep-alive connection (as SDK clients do). It prints ``probing`` once every worker had a
good answer; on SIGTERM no worker starts another request, the ones in flight finish, and one JSON
object with every request goes to stdout:

    {"requests": [{"kind": "stream"|"plain", "t0": ..., "t1": ..., "status": 200|503|"ReadError",
                   "retry_after": "2"|null, "tokens": N, "finish": "length"|null, "done": bool}]}

A stream is *cut* when it answered 200 but ended without ``[DONE]``, without a finish_reason, or
with fewer tokens than asked. ``classify`` sorts the requests; tests and benches share it.

    python tests/proxy_prober.py URL MODEL [--streams 4] [--plain 2] [--tokens 30]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any

import httpx


def _stream(client: httpx.Client, url: str, model: str, tokens: int) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "stream",
        "t0": time.monotonic(),
        "tokens": 0,
        "finish": None,
        "done": False,
        "retry_after": None,
    }
    body = {"model": model, "prompt": "hi", "max_tokens": tokens, "stream": True}
    try:
        with client.stream("POST", f"{url}/completions", json=body) as r:
            rec["status"], rec["retry_after"] = r.status_code, r.headers.get("retry-after")
            if r.status_code != 200:
                r.read()
            else:
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        rec["done"] = True
                        continue
                    choice = json.loads(data)["choices"][0]
                    rec["tokens"] += 1
                    rec["finish"] = choice.get("finish_reason") or rec["finish"]
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        rec.setdefault("status", type(exc).__name__)
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["t1"] = time.monotonic()
    return rec


def _plain(client: httpx.Client, url: str, model: str) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "kind": "plain",
        "t0": time.monotonic(),
        "tokens": 0,
        "finish": None,
        "done": False,
        "retry_after": None,
    }
    try:
        r = client.post(f"{url}/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
        rec["status"], rec["retry_after"] = r.status_code, r.headers.get("retry-after")
        if r.status_code == 200:
            choice = r.json()["choices"][0]
            rec["tokens"], rec["finish"], rec["done"] = 2, choice.get("finish_reason"), True
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        rec.setdefault("status", type(exc).__name__)
        rec["error"] = f"{type(exc).__name__}: {exc}"
    rec["t1"] = time.monotonic()
    return rec


def classify(requests: list[dict[str, Any]], tokens: int) -> dict[str, list[dict[str, Any]]]:
    """ok / cut (a 200 stream that ended early) / gap (503 with Retry-After) / failed (the rest)."""
    out: dict[str, list[dict[str, Any]]] = {"ok": [], "cut": [], "gap": [], "failed": []}
    for rec in requests:
        if rec["status"] == 200:
            whole = (
                rec["done"]
                and rec["finish"] is not None
                and rec["tokens"] >= (tokens if rec["kind"] == "stream" else 2)
            )
            out["ok" if whole else "cut" if rec["kind"] == "stream" else "failed"].append(rec)
        elif rec["status"] == 503 and rec["retry_after"]:
            out["gap"].append(rec)
        else:
            out["failed"].append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--plain", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=30)
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    good: set[int] = set()

    def worker(i: int, streaming: bool) -> None:
        with httpx.Client(timeout=httpx.Timeout(30.0)) as client:
            while not stop.is_set():
                rec = (
                    _stream(client, args.url, args.model, args.tokens)
                    if streaming
                    else _plain(client, args.url, args.model)
                )
                with lock:
                    records.append(rec)
                    if rec["status"] == 200:
                        good.add(i)
                if rec["status"] != 200:
                    stop.wait(0.05)  # a refused or 503 answer: do not spin

    kinds = [True] * args.streams + [False] * args.plain
    threads = [threading.Thread(target=worker, args=(i, s), daemon=True) for i, s in enumerate(kinds)]
    for t in threads:
        t.start()
    while not stop.is_set() and len(good) < len(kinds):
        stop.wait(0.02)
    print("probing", flush=True)
    stop.wait()
    for t in threads:
        t.join()
    json.dump({"requests": records}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
