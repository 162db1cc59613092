#!/usr/bin/env python3
"""What orchestrator.loadgen and `vllm bench serve` send, side by side, against a logging server.

Starts a small HTTP/1.1 server on loopback that records every request (arrival on CLOCK_MONOTONIC,
its connection, headers, body) and streams max_tokens one-token SSE events plus usage, then runs
both clients at one concurrency against it and prints: the request sequence of each (what comes
before the timed requests: calibration probes, /tokenize, /metrics, warm-up), the fields and headers
of a timed request, the connections its first C timed requests used (opened before them or not),
how long those C took to arrive, and each client's CPU per timed request (user+sys of a run of 2N
less a run of N: start-up and vLLM's import cancel out). The server counts 128 prompt tokens whatever
the prompt, so ours calibrates its prompt down to the tag alone here: compare fields, not prompt sizes.

    .venv/bin/python bench/loadgen/request_capture.py --vllm-python /opt/vllm-cpu/bin/python \
        --tokenizer /var/lib/orchestrator-test/models/tiny-a --concurrency 64 --requests 256

``--order LOG`` instead reads a vLLM server log (uvicorn's access lines, as bench/loadgen/cpu_compare.sh keeps
them) and prints how each run's requests reached the server: ``N`` a completion on a new connection,
``r`` on a connection seen before, ``o`` GET /v1/models, ``m`` GET /metrics (the sampler: every
--sample-interval), ``T`` POST /tokenize; a run whose completions are interleaved with several ``m``
was admitted over that many sampler periods.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ACCESS = re.compile(r'127\.0\.0\.1:(\d+) - "([A-Z]+) (\S+)')


class LoggingServer:
    def __init__(self, token_delay: float) -> None:
        self.delay = token_delay
        self.seen: list[dict[str, Any]] = []
        self._conns = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns += 1
        conn, nth = self._conns, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.monotonic()
                lines = head.decode().split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                nth += 1
                method, path = lines[0].split()[:2]
                self.seen.append(
                    {
                        "t": arrived,
                        "conn": conn,
                        "nth": nth,
                        "method": method,
                        "path": path,
                        "headers": headers,
                        "body": body.decode("utf-8", "replace"),
                    }
                )
                if path == "/v1/completions":
                    await self._stream(writer, json.loads(body))
                else:
                    data = json.dumps(
                        {"object": "list", "data": [{"id": "tiny-a"}]}
                        if path == "/v1/models"
                        else {"tokens": [1] * 128, "count": 128}
                    ).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(data), data)
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, req: dict[str, Any]) -> None:
        tokens = int(req.get("max_tokens") or 16)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        def chunk(event: dict[str, Any] | str) -> None:
            data = f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        for _ in range(tokens):
            await asyncio.sleep(self.delay)
            chunk({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": " a"}]})
        # 128 prompt tokens whatever the prompt: ours calibrates against this count
        chunk({"id": "c", "choices": [], "usage": {"prompt_tokens": 128, "completion_tokens": tokens}})
        chunk("[DONE]")
        writer.write(b"0\r\n\r\n")


def run_ours(url: str, c: int, n: int) -> float:
    """Our client in a child process (as `orchestrator bench` runs it); returns its CPU seconds."""
    code = (
        f"import asyncio, sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from orchestrator.loadgen import BenchPlan, BenchTarget, LoadGenerator\n"
        f"plan = BenchPlan(concurrency=({c},), requests={n}, prompt_tokens=128, max_tokens=128, ignore_eos=True)\n"
        f"asyncio.run(LoadGenerator(BenchTarget({url!r}, model='tiny-a'), plan).run())\n"
    )
    return child_cpu([sys.executable, "-c", code])


def run_vllm(python: str, url: str, tokenizer: str, c: int, n: int) -> float:
    shim = (
        "import importlib.metadata as md, sys\n"
        "try:\n    md.version('vllm')\nexcept md.PackageNotFoundError:\n"
        "    real = md.version\n    md.version = lambda name: real('vllm-cpu') if name == 'vllm' else real(name)\n"
        "from vllm.entrypoints.cli.main import main\nsys.argv[0] = 'vllm'\nmain()\n"
    )
    argv = [
        python,
        "-c",
        shim,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "tiny-a",
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        "128",
        "--random-output-len",
        "128",
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(c),
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        "1",
        "--disable-tqdm",
    ]
    return child_cpu(argv, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def child_cpu(argv: list[str], env: dict[str, str] | None = None) -> float:
    before = os.times()
    with tempfile.TemporaryFile() as log:
        done = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
        if done.returncode:
            log.seek(0)
            raise SystemExit(f"{argv[:3]} exited {done.returncode}: {log.read()[-2000:].decode()}")
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def describe(name: str, seen: list[dict[str, Any]], c: int, n: int, cpu: float) -> dict[str, Any]:
    timed = [r for r in seen if r["path"] == "/v1/completions"][-n:]
    before = seen[: seen.index(timed[0])]
    first = sorted(timed[:c], key=lambda r: r["t"])
    body = json.loads(timed[-1]["body"])
    prompt = body.pop("prompt", None) or body.pop("messages", None)
    opened_before = sum(1 for r in first if r["nth"] > 1)
    return {
        "tool": name,
        "before the timed requests": runs(
            [
                f"{r['method']} {r['path']}"
                + (f" max_tokens={json.loads(r['body']).get('max_tokens')}" if r["path"] == "/v1/completions" else "")
                for r in before
            ]
        ),
        "timed request fields": body,
        "prompt": f"{type(prompt).__name__} of {len(prompt)} chars/items",
        "timed request headers": {k: v for k, v in timed[-1]["headers"].items() if k != "content-length"},
        f"first {c} timed requests: on connections opened before them": opened_before,
        f"first {c} timed requests: arrival spread ms": round((first[-1]["t"] - first[0]["t"]) * 1e3, 1),
        "connections in all": len({r["conn"] for r in seen}),
        "client CPU ms per timed request (marginal: runs of 2N and N)": round(cpu / n * 1e3, 2),
    }


def runs(items: list[str]) -> list[str]:
    """Repeats folded: ["GET /v1/models x64", ...]."""
    out: list[list[Any]] = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return [f"{item} x{k}" if k > 1 else item for item, k in out]


def capture(a: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    for tool in ("ours", "vllm"):
        cpu = {}
        for n in (2 * a.requests, a.requests):  # the second run's server log is the one described
            server = LoggingServer(a.token_delay)
            url = f"http://127.0.0.1:{server.port}"
            cpu[n] = (
                run_ours(url, a.concurrency, n)
                if tool == "ours"
                else run_vllm(a.vllm_python, url, a.tokenizer, a.concurrency, n)
            )
        out.append(describe(tool, server.seen, a.concurrency, a.requests, cpu[2 * a.requests] - cpu[a.requests]))
    for d in out:
        print(json.dumps(d, indent=1))
    print(f"load average: {os.getloadavg()}")
    return 0


def order(log: str) -> int:
    """The start of each run of a server log: its requests in the order the server logged them."""
    seen: set[str] = set()
    marks = ""
    for line in Path(log).read_text(errors="replace").splitlines():
        m = ACCESS.search(line)
        if not m:
            continue
        port, _method, path = m.groups()
        marks += {
            "/v1/completions": "r" if port in seen else "N",
            "/metrics": "m",
            "/tokenize": "T",
            "/v1/models": "o",
        }.get(path, "?")
        seen.add(port)
    # runs are separated by the sampler's idle polls (3 or more /metrics in a row)
    for run in re.split(r"m{3,}", marks):
        if sum(run.count(k) for k in "Nr") >= 16:
            print(re.sub(r"o{8,}", lambda x: f"[{len(x.group())} o]", run)[:110])
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", default=sys.executable)
    p.add_argument("--tokenizer", default="/var/lib/orchestrator-test/models/tiny-a")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--token-delay", type=float, default=0.005, help="server seconds per streamed token")
    p.add_argument("--order", metavar="LOG", help="only print the request order of a vLLM server log")
    a = p.parse_args()
    return order(a.order) if a.order else capture(a)


if __name__ == "__main__":
    sys.exit(main())
