#!/usr/bin/python3 -IS
"""Stand-in nvidia-smi for test hosts: answers the CSV queries the orchestrator uses.

GPUs come from $STANDIN_GPU_DIR/gpus.json ({"count", "memory_mib", "name"}; missing -> 8 GPUs;
"driver": false -> the answer of a box whose NVIDIA driver is not loaded, exit 9 = NVML's error code);
memory holders from one <pid>.json per process ({"pid", "name", "gpus": [...], "mib_per_gpu"}),
written by tests/standin/openai_server.py. Files of processes that are gone are ignored, so GPU
memory frees when the holder dies, as on real hardware. Output matches real nvidia-smi 580
(captured on an H200: tests/fixtures/nvidia-smi/), including its answer to an unknown field.
tests/standin/fake_nvml.c serves the same state through NVML (a stand-in libnvidia-ml.so.1).
Standard library only: it runs with the host's /usr/bin/python3, isolated and without site (-IS).

The agent runs it several times a second while GPUs free, and the real nvidia-smi is a C program:
so it imports only what it must (json, os, sys; no pathlib, uuid or socket, ~20 ms of CPU a call).
"""

from __future__ import annotations

import json
import os
import sys

GPU_DIR = os.environ.get("STANDIN_GPU_DIR", "/run/standin-gpu")
_DNS_NAMESPACE = bytes.fromhex("6ba7b8109dad11d180b400c04fd430c8")  # uuid.NAMESPACE_DNS
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
DEFAULT = {"count": 8, "memory_mib": 97887, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}

# field -> (header name, unit); aliases map to the canonical name real nvidia-smi prints.
GPU_FIELDS = {
    "index": ("index", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "count": ("count", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "gpu_bus_id": ("pci.bus_id", ""),
    "driver_version": ("driver_version", ""),
}
APP_FIELDS = {
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "name": ("process_name", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
}


def gpu_uuid(index: int) -> str:
    """uuid.uuid5(NAMESPACE_DNS, "<hostname>.gpu<index>"), without importing uuid."""
    try:
        from _sha1 import sha1  # CPython's built-in module: hashlib would load OpenSSL
    except ImportError:
        from hashlib import sha1
    digest = bytearray(sha1(_DNS_NAMESPACE + f"{os.uname().nodename}.gpu{index}".encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def bus_id(index: int) -> str:
    return f"00000000:{index + 0x18:02X}:00.0"


def load_gpus(gpu_dir: str | os.PathLike[str] = GPU_DIR) -> dict[str, object]:
    try:
        return {**DEFAULT, **json.loads(_read(os.path.join(gpu_dir, "gpus.json")))}
    except (FileNotFoundError, ValueError):
        return dict(DEFAULT)


def alive(pid: int) -> bool:
    try:
        stat = _read(f"/proc/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def load_holders(count: int, gpu_dir: str | os.PathLike[str] = GPU_DIR) -> list[tuple[int, int, str, int]]:
    """(gpu index, pid, process name, MiB) of every live holder, ordered like nvidia-smi."""
    rows = []
    try:
        names = os.listdir(gpu_dir)
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json") or name == "gpus.json":
            continue
        try:
            h = json.loads(_read(os.path.join(gpu_dir, name)))
            pid, name, mib = int(h["pid"]), str(h["name"]), int(h["mib_per_gpu"])
            gpus = [int(g) for g in h["gpus"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive(pid):
            rows += [(g, pid, name, mib) for g in gpus if 0 <= g < count]
    return sorted(rows)


def fail(message: str, code: int = 2, blank: bool = True) -> int:
    print(message + ("\n" if blank else ""))  # real nvidia-smi reports these on stdout
    return code


def render(
    fields: list[str], table: dict[str, tuple[str, str]], rows: list[dict[str, object]], header: bool, units: bool
) -> None:
    out = []
    if header:
        out.append(", ".join(table[f][0] for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            value, unit = row[table[f][0]], table[f][1]
            cells.append(f"{value} {unit}" if unit and units else str(value))
        out.append(", ".join(cells))
    if out:
        print("\n".join(out))


def main(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("--query-gpu", "--query-compute-apps", "--format", "-L", "--list-gpus"):
            return fail(f"ERROR: Option {key} is not recognized. Please run 'nvidia-smi -h'.", 255)
        opts[key] = value
    spec = load_gpus()
    if spec.get("driver") is False:
        return fail(NO_DRIVER, 9)
    count, total, gname = int(str(spec["count"])), int(str(spec["memory_mib"])), str(spec["name"])
    holders = load_holders(count)
    if "-L" in opts or "--list-gpus" in opts:
        for i in range(count):
            print(f"GPU {i}: {gname} (UUID: {gpu_uuid(i)})")
        return 0
    query = opts.get("--query-gpu") or opts.get("--query-compute-apps")
    if not query:
        return table(count, total, gname, holders)
    fmt = opts.get("--format", "").split(",")
    if fmt[0] != "csv" or not set(fmt[1:]) <= {"noheader", "nounits"}:
        return fail("Format modifier is not recognized.", blank=False)
    flags = set(fmt[1:])
    fields = [f.strip() for f in query.split(",")]
    known = GPU_FIELDS if "--query-gpu" in opts else APP_FIELDS
    for f in fields:
        if f not in known:
            return fail(f'Field "{f}" is not a valid field to query.')
    if "--query-gpu" in opts:
        rows: list[dict[str, object]] = []
        for i in range(count):
            used = sum(m for g, _, _, m in holders if g == i)
            rows.append(
                {
                    "index": i,
                    "uuid": gpu_uuid(i),
                    "name": gname,
                    "memory.total [MiB]": total,
                    "memory.used [MiB]": used,
                    "memory.free [MiB]": max(total - used, 0),
                    "count": count,
                    "pci.bus_id": bus_id(i),
                    "driver_version": "580.159.04",
                }
            )
    else:
        rows = [
            {
                "pid": pid,
                "process_name": name,
                "gpu_uuid": gpu_uuid(g),
                "gpu_name": gname,
                "gpu_bus_id": bus_id(g),
                "used_gpu_memory [MiB]": mib,
            }
            for g, pid, name, mib in holders
        ]
    render(fields, known, rows, "noheader" not in flags, "nounits" not in flags)
    return 0


def table(count: int, total: int, gname: str, holders: list[tuple[int, int, str, int]]) -> int:
    """A short human summary (the real table's layout is not something the tool parses)."""
    for i in range(count):
        used = sum(m for g, _, _, m in holders if g == i)
        print(f"|  {i:2d}  {gname:<45} | {used:>6}MiB / {total:>6}MiB |")
    for g, pid, name, mib in holders:
        print(f"|  {g:2d}  {pid:>8}  C  {name:<30} {mib:>6}MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
