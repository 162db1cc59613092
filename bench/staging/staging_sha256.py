#!/usr/bin/env python3
"""What verifying sha256 while staging costs: MB/s with and without hashing, on this machine.

Four measurements, each the median of --repeats runs over --size-mib MiB:

1. ``sha256 only``: hashlib over in-memory 10 MiB chunks (the CPU ceiling of any hashing).
2. ``disk write``: the bytes written in 10 MiB chunks (the hub client's chunk size) to a file under
   --dir and fsynced, through a plain file and through the worker's HashingWriter.
3. ``resume re-hash``: HashingWriter(have=size) over the file just written (what a resume pays for the
   kept .part; the page cache is warm, so this is the CPU side).
4. ``hub download``: huggingface_hub's http_get of a --size-mib file from the local hub stand-in
   (tests/hubstub, loopback HTTP) into a plain file and into a HashingWriter.

Pairs run alternately after a warm-up each. Cost per GiB = (seconds with hashing - seconds without) / GiB.
Prints a table; nothing is asserted.

    .venv/bin/python bench/staging/staging_sha256.py [--size-mib 1024] [--repeats 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.worker.files import HashingWriter
from tests.hubstub import HubStub, StubRepo

CHUNK = 10 * 1024 * 1024  # huggingface_hub's DOWNLOAD_CHUNK_SIZE
SHA = "b" * 40


def timed(fn: Callable[[], object], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def paired(plain: Callable[[], object], hashed: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of each, after one warm-up of each, alternating which goes first (load drift
    and file-allocation effects hit both alike)."""
    plain(), hashed()
    t0: list[float] = []
    t1: list[float] = []
    for i in range(repeats):
        for fn, runs in ((plain, t0), (hashed, t1)) if i % 2 == 0 else ((hashed, t1), (plain, t0)):
            t = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t)
    return statistics.median(t0), statistics.median(t1)


def write_file(path: Path, data: bytes, *, hashed: bool) -> str:
    with open(path, "w+b") as f:
        out: HashingWriter | None = HashingWriter(f) if hashed else None
        for i in range(0, len(data), CHUNK):
            (out or f).write(data[i : i + CHUNK])
        f.flush()
        os.fsync(f.fileno())
        return out.hexdigest() if out else ""


def rehash(path: Path, size: int) -> str:
    with open(path, "r+b") as f:
        return HashingWriter(f, have=size).hexdigest()


def download(url: str, path: Path, size: int, *, hashed: bool) -> str:
    from huggingface_hub.file_download import http_get

    with open(path, "w+b") as f:
        out = HashingWriter(f) if hashed else None
        http_get(url, out or f, expected_size=size)  # type: ignore[arg-type]
        f.flush()
        os.fsync(f.fileno())
        return out.hexdigest() if out else ""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default="/var/tmp")
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    size = args.size_mib << 20
    gib = size / (1 << 30)
    block = random.Random(0).randbytes(CHUNK)  # incompressible; repeating it is fine for throughput
    data = (block * (size // CHUNK + 1))[:size]
    want = hashlib.sha256(data).hexdigest()
    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}, Python "
        f"{platform.python_version()}, OpenSSL {__import__('ssl').OPENSSL_VERSION}"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"size {args.size_mib} MiB, {args.repeats} repeats (median), chunks of {CHUNK >> 20} MiB, "
        f"files under {args.dir}"
    )
    rows: list[tuple[str, float, float | None]] = []

    def sha_only() -> None:
        h = hashlib.sha256()
        for i in range(0, size, CHUNK):
            h.update(data[i : i + CHUNK])

    rows.append(("sha256 only (memory)", timed(sha_only, args.repeats), None))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        f = Path(tmp) / "shard.safetensors.part"
        plain, hashed = paired(
            lambda: write_file(f, data, hashed=False), lambda: write_file(f, data, hashed=True), args.repeats
        )
        assert write_file(f, data, hashed=True) == want
        rows.append(("disk write + fsync", plain, hashed))
        rows.append(("resume re-hash of the part (warm cache)", timed(lambda: rehash(f, size), args.repeats), None))
        with HubStub() as hub:
            hub.add(StubRepo.of("bench/big", {"config.json": b"{}", "model.safetensors": data}, sha=SHA))
            url = f"{hub.url}/bench/big/resolve/{SHA}/model.safetensors"
            plain, hashed = paired(
                lambda: download(url, f, size, hashed=False), lambda: download(url, f, size, hashed=True), args.repeats
            )
            assert download(url, f, size, hashed=True) == want
        rows.append(("hub download (loopback) + fsync", plain, hashed))

    print()
    print("| measurement | without hashing MB/s | with sha256 MB/s | cost s/GiB |")
    print("|---|---|---|---|")
    for name, t0, t1 in rows:
        mbs0 = size / 1e6 / t0
        if t1 is None:
            print(f"| {name} | {mbs0:.0f} (hashing itself) | | {t0 / gib:.2f} |")
        else:
            print(f"| {name} | {mbs0:.0f} | {size / 1e6 / t1:.0f} | {(t1 - t0) / gib:+.2f} |")
    print()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
