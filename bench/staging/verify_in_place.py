#!/usr/bin/env python3
"""What verifying weights used in place (``local:/dir``) costs before a switch, on this machine.

A sharded model of --size-mib MiB (--shards safetensors files, an index, config.json) is written
under --dir; then the worker's verify_in_place runs --repeats times (median) two ways:

1. ``no sha256 known``: index names and sizes, every safetensors header (what every directory gets).
2. ``manifest with sha256``: the same plus the sha256 of every file (a staged revision used in place).

Prints a table; nothing is asserted.

    .venv/bin/python bench/staging/verify_in_place.py [--size-mib 512] [--shards 4] [--repeats 3] [--dir /var/tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from orchestrator.core.weights import MANIFEST_NAME
from orchestrator.worker.verify import verify_in_place
from tests.hubstub.models import safetensors_bytes


def write_model(base: Path, size_mib: int, shards: int) -> None:
    floats = size_mib * (1 << 20) // 4 // shards
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        (base / name).write_bytes(safetensors_bytes({f"layers.{i}.weight": (floats,)}, seed=i))
        weight_map[f"layers.{i}.weight"] = name
    (base / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (base / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def add_manifest(base: Path) -> None:
    files = {p.name: p.stat().st_size for p in base.iterdir() if not p.name.startswith(".")}
    sha = {n: hashlib.sha256((base / n).read_bytes()).hexdigest() for n in files}
    (base / MANIFEST_NAME).write_text(
        json.dumps(
            {
                "name": "m",
                "repo": "org/m",
                "revision": "a" * 40,
                "files": files,
                "source": "hub",
                "staged_at": 0,
                "path": str(base),
                "sha256": sha,
            }
        )
    )


def timed(base: Path, repeats: int) -> tuple[float, str]:
    runs, checked = [], ""
    for _ in range(repeats):
        t = time.perf_counter()
        checked = verify_in_place(base, where=str(base)).checked
        runs.append(time.perf_counter() - t)
    return statistics.median(runs), checked


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"model: {args.size_mib} MiB in {args.shards} shards under {args.dir}, {args.repeats} repeats (median), "
        "page cache warm\n"
    )
    base = Path(tempfile.mkdtemp(prefix="verify-bench-", dir=args.dir))
    try:
        write_model(base, args.size_mib, args.shards)
        rows = [("no sha256 known", *timed(base, args.repeats))]
        add_manifest(base)
        rows.append(("manifest with sha256", *timed(base, args.repeats)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("| check | seconds | MiB/s | what was checked |\n|---|---|---|---|")
    for name, seconds, checked in rows:
        print(f"| {name} | {seconds:.4f} | {args.size_mib / seconds:.0f} | {checked} |")
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
