"""Parsing nvidia-smi's CSV answers (``--format=csv,noheader,nounits``) into a GpuSnapshot.

Pure: the adapter runs the commands, this module only builds argv and reads text. Real outputs
carry "[N/A]" / "[Not Supported]" where a value is unavailable (MIG, containers, vGPU); those read
as 0 MiB, and a process whose memory is unknown still counts as holding its GPU (by PID).
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.errors import OrchestratorError

GPU_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used")
APP_FIELDS = ("pid", "process_name", "gpu_uuid", "used_memory")
_CSV = "--format=csv,noheader,nounits"


def gpu_query(fields: Sequence[str] = GPU_FIELDS) -> list[str]:
    """Arguments (after the binary) of the per-GPU query."""
    return ["--query-gpu=" + ",".join(fields), _CSV]


def apps_query(fields: Sequence[str] = APP_FIELDS) -> list[str]:
    """Arguments (after the binary) of the compute-process query."""
    return ["--query-compute-apps=" + ",".join(fields), _CSV]


class NvsmiParseError(OrchestratorError):
    """nvidia-smi answered something that is not the CSV we asked for; names the line."""


def _unavailable(value: str) -> bool:
    return value.startswith("[") and value.endswith("]")  # [N/A], [Not Supported], [Unknown Error]


def _mib(value: str, what: str, line: str) -> int:
    value = value.removesuffix(" MiB").strip()
    if _unavailable(value) or value == "N/A":
        return 0
    try:
        return int(float(value))
    except ValueError:
        raise NvsmiParseError(f"nvidia-smi: {what} {value!r} is not a number in line {line!r}") from None


def _rows(text: str, fields: Sequence[str], free_text: str | None) -> list[dict[str, str]]:
    """Split CSV lines into field dicts; extra commas belong to the one free-text field."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        if cells[0] == fields[0]:
            continue  # a header line (someone left out noheader)
        if len(cells) > len(fields) and free_text in fields:
            i = fields.index(free_text)
            extra = len(cells) - len(fields)
            cells[i : i + extra + 1] = [", ".join(cells[i : i + extra + 1])]
        if len(cells) != len(fields):
            raise NvsmiParseError(
                f"nvidia-smi: expected {len(fields)} fields ({', '.join(fields)}), got {len(cells)} in line {line!r}"
            )
        rows.append(dict(zip(fields, cells, strict=True)))
    return rows


def _whole(row: dict[str, str], key: str, what: str) -> tuple[int, str]:
    """(the integer in ``key``, the row's line for messages); NvsmiParseError naming ``what`` otherwise."""
    line = ", ".join(row.values())
    try:
        return int(row[key]), line
    except ValueError:
        raise NvsmiParseError(f"nvidia-smi: {what} {row[key]!r} in line {line!r}") from None


def parse_gpus(text: str, fields: Sequence[str] = GPU_FIELDS) -> tuple[GpuInfo, ...]:
    """GPUs from the --query-gpu answer (fields in the order they were asked for)."""
    gpus = []
    for row in _rows(text, fields, "name"):
        index, line = _whole(row, "index", "GPU index")
        gpus.append(
            GpuInfo(
                index=index,
                uuid=row.get("uuid", ""),
                name=row.get("name", ""),
                memory_total_mib=_mib(row.get("memory.total", "0"), "memory.total", line),
                memory_used_mib=_mib(row.get("memory.used", "0"), "memory.used", line),
            )
        )
    return tuple(sorted(gpus, key=lambda g: g.index))


def parse_apps(text: str, gpus: Sequence[GpuInfo], fields: Sequence[str] = APP_FIELDS) -> tuple[GpuProcess, ...]:
    """Compute processes from the --query-compute-apps answer; gpu_index resolved by UUID."""
    index_of = {g.uuid: g.index for g in gpus}
    procs = []
    for row in _rows(text, fields, "process_name"):
        pid, line = _whole(row, "pid", "pid")
        uuid = row.get("gpu_uuid", "")
        procs.append(
            GpuProcess(
                pid=pid,
                process_name=row.get("process_name", ""),
                gpu_uuid=uuid,
                used_memory_mib=_mib(row.get("used_memory", "0"), "used_memory", line),
                gpu_index=index_of.get(uuid, -1),
            )
        )
    return tuple(procs)


def parse_snapshot(gpu_text: str, apps_text: str) -> GpuSnapshot:
    """Both answers (default fields) as one snapshot."""
    gpus = parse_gpus(gpu_text)
    return GpuSnapshot(gpus=gpus, processes=parse_apps(apps_text, gpus))
