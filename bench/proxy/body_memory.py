#!/usr/bin/env python3
"""HAProxy's memory per held connection at the body buffer routing needs, against its default.

The front proxy reads a request's whole body to find its `model` (issue 42), so `tune.bufsize` is the
largest body the host's models accept (core/proxy.py: max_model_len at 8 bytes a token + 64 KiB,
plus 32 KiB for headers). This measures what that costs: a fresh HAProxy 2.6 per case, from the
product's rendered config (the default case drops its `tune.bufsize` line: 16 KiB), one route to a
loopback engine that reads every request and never answers (a long generation). N client connections
each send the headers and then SENT bytes of a BODY-byte chat request whose `model` is the last key,
and hold; the figure is the RSS of the HAProxy process (`-db`: one process, the worker) once they are
held, less its RSS before, over N. `after close`: RSS once every connection closed (what pools keep).
Also each buffer size's RSS at start for several nbthread values (a fixed cost, per thread).

    .venv/bin/python bench/proxy/body_memory.py > bench/proxy/body_memory.txt   (raw: body_memory.json)
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from orchestrator.core.catalog import Proxy
from orchestrator.core.proxy import BodyLimit, Route, body_limit, render_config
from orchestrator.resources import template_text

HAPROXY = "/usr/sbin/haproxy"
BODY = 1_000_000
# (label, limit): HAProxy's default buffer; contexts of 128k and 256k tokens (the default without
# max_model_len); 1M tokens.
SIZES: list[tuple[str, BodyLimit | None]] = [
    ("default 16 KiB", None),
    ("128k ctx", body_limit([131_072])),
    ("256k ctx", body_limit([262_144])),
    ("1M ctx", body_limit([1_048_576])),
]
# (label, connections, body bytes sent before holding)
CASES = [
    ("idle (connected, nothing sent)", 200, -1),
    ("headers + 1 KB of body", 200, 1_000),
    ("headers + 64 KB of body", 100, 64_000),
    ("headers + 900 KB of body", 50, 900_000),
    ("whole 1 MB body, held at the engine", 50, BODY),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Sink:
    """A loopback engine that reads each request's bytes and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = int(self.sock.getsockname()[1])
        self.received = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        while data := conn.recv(65536):
            self.received += len(data)


def request_bytes(size: int) -> bytes:
    frame = json.dumps({"messages": [{"role": "user", "content": ""}], "model": "chat"}, sort_keys=True)
    body = json.dumps(
        {"messages": [{"role": "user", "content": "x" * (size - len(frame))}], "model": "chat"}, sort_keys=True
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: box\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body


def push(socks: list[socket.socket], data: bytes, upto: int, seconds: float = 30) -> list[int]:
    """Send each socket the first ``upto`` bytes of ``data`` without blocking on any; bytes sent each."""
    sent = [0] * len(socks)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pending = [i for i, n in enumerate(sent) if n < upto]
        if not pending:
            break
        _, ready, _ = select.select([], [socks[i] for i in pending], [], 0.2)
        for i in pending:
            if socks[i] in ready:
                try:
                    sent[i] += socks[i].send(data[sent[i] : min(upto, sent[i] + 262144)])
                except OSError:
                    sent[i] = upto  # HAProxy answered and closed: nothing more will be held
    return sent


def config(tmp: Path, port: int, engine: int, limit: BodyLimit | None, threads: int | None = None) -> Path:
    text = render_config(
        Proxy(enabled=True, port=port),
        "127.0.0.1",
        [Route("chat", "127.0.0.1", engine)],
        template_text("haproxy.cfg.j2"),
        **({"body": limit} if limit else {}),
    )
    text = text.replace('"/run/orchestrator-proxy/admin.sock"', f'"{tmp}/admin.sock"')
    lines = [ln for ln in text.splitlines() if not (limit is None and ln.strip().startswith("tune.bufsize"))]
    if threads:
        lines.insert(lines.index("global") + 1, f"    nbthread {threads}")
    path = tmp / "haproxy.cfg"
    path.write_text("\n".join(lines) + "\n")
    return path


def started(cfg: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            time.sleep(0.3)  # its first connection's allocations settle before the baseline
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"HAProxy did not listen on {port}")


def pools(tmp: Path) -> dict[str, str]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(tmp / "admin.sock"))
        s.sendall(b"show info\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    info = dict(line.split(": ", 1) for line in out.decode().splitlines() if ": " in line)
    return {k: info[k] for k in ("PoolAlloc_MB", "PoolUsed_MB", "Nbthread") if k in info}


def held_case(sink: Sink, limit: BodyLimit | None, conns: int, upto: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp, port = Path(d), free_port()
        proc = started(config(tmp, port, sink.port, limit), port)
        try:
            before = rss_kib(proc.pid)
            got = sink.received
            socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
            for s in socks:
                s.setblocking(False)
            data = request_bytes(BODY)
            header = data.index(b"\r\n\r\n") + 4
            sent = push(socks, data, header + upto) if upto >= 0 else [0] * conns
            time.sleep(1.0)  # HAProxy reads what the kernel holds for it
            answered = sum(1 for s in socks if select.select([s], [], [], 0)[0])
            held = rss_kib(proc.pid)
            info = pools(tmp)
            for s in socks:
                s.close()
            time.sleep(1.0)
            after = rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "bufsize": limit.bufsize if limit else 16384,
        "conns": conns,
        "body_sent": max(0, upto),
        "sent_per_conn": round(sum(sent) / conns),
        "engine_got_per_conn": round((sink.received - got) / conns),
        "answered_by_proxy": answered,
        "rss_before_kib": before,
        "rss_held_kib": held,
        "rss_after_close_kib": after,
        "per_conn_kib": round((held - before) / conns, 1),
        **info,
    }


def start_rss(limit: BodyLimit | None, threads: int) -> int:
    with tempfile.TemporaryDirectory() as d:
        tmp, port = Path(d), free_port()
        proc = started(config(tmp, port, 9, limit, threads), port)
        try:
            return rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    sink = Sink()
    version = subprocess.run([HAPROXY, "-v"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    raw: dict[str, Any] = {"haproxy": version, "body_bytes": BODY, "held": [], "start": []}
    print(raw["haproxy"])
    print(
        f"{BODY:,}-byte chat requests, `model` last; RSS of the HAProxy process (kB); per conn = (held - before) / N\n"
    )
    print(f"{'case':38} {'buffer':26} {'N':>4} {'per conn kB':>11} {'before':>7} {'held':>7} {'after close':>11}  note")
    for case, conns, upto in CASES:
        for label, limit in SIZES:
            r = held_case(sink, limit, conns, upto)
            raw["held"].append({"case": case, "buffer": label, **r})
            note = (f"{r['answered_by_proxy']} answered by the proxy" if r["answered_by_proxy"] else "") + (
                f" engine got {r['engine_got_per_conn']:,} B/conn" if r["engine_got_per_conn"] else ""
            )
            print(
                f"{case:38} {label + ' (' + format(r['bufsize'], ',') + ')':26} {conns:>4} {r['per_conn_kib']:>11} "
                f"{r['rss_before_kib']:>7} {r['rss_held_kib']:>7} {r['rss_after_close_kib']:>11}  {note.strip()}",
                flush=True,
            )
    print("\nRSS at start (kB), by nbthread: a fixed cost")
    for threads in (2, 16, 64):
        row = {label: start_rss(limit, threads) for label, limit in SIZES}
        raw["start"].append({"nbthread": threads, **row})
        print(f"  nbthread {threads:>2}: " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    (Path(__file__).with_suffix(".json")).write_text(json.dumps(raw, indent=1) + "\n")


if __name__ == "__main__":
    main()
