"""The safetensors format, pure: whether a file's first 8 bytes can be its header length, and what is
wrong with a header against the file's size (offsets leaving the file or not tiling its data, a
tensor's bytes against its dtype and shape, tensors the index places in the file but absent). The
worker reads the bytes (worker/verify.py); this decides.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from orchestrator.core.weights import INDEX_NAME

# safetensors: an 8-byte little-endian header length, that many bytes of JSON, then the tensor data.
SAFETENSORS_MAX_HEADER = 100 << 20  # the format's own limit (safetensors refuses larger headers)
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


def header_length_problem(name: str, size: int, length: int) -> str | None:
    """Why ``length`` (the file's first 8 bytes) cannot be the header length of a ``size``-byte file."""
    if size < 8:
        return f"{name}: {size} bytes, too short for a safetensors file (8-byte header length, then JSON)"
    if length > size - 8:
        return f"{name}: safetensors header length {length} is larger than the file ({size} bytes)"
    if length > SAFETENSORS_MAX_HEADER:
        return f"{name}: safetensors header length {length} is over the format's limit of {SAFETENSORS_MAX_HEADER}"
    return None


def _offsets(info: object) -> tuple[int, int] | None:
    offsets = info.get("data_offsets") if isinstance(info, Mapping) else None
    if (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(v) is int for v in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        return offsets[0], offsets[1]
    return None


def _tensor_bytes(info: Mapping[str, object]) -> int | None:
    """dtype size x shape, when both are known kinds (sub-byte dtypes are not checked)."""
    width, shape = _DTYPE_BYTES.get(str(info.get("dtype"))), info.get("shape")
    if width is None or not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        return None
    n = width
    for d in shape:
        n *= d
    return n


def safetensors_problems(name: str, size: int, header: bytes, indexed: Iterable[str] = ()) -> list[str]:
    """What is wrong with a safetensors file of ``size`` bytes whose header JSON is ``header``: tensors
    whose offsets leave the file or do not tile its data, and tensors ``indexed`` there but absent."""
    data = size - 8 - len(header)
    try:
        parsed = json.loads(header.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        return [f"{name}: safetensors header is not JSON ({exc})"]
    if not isinstance(parsed, dict):
        return [f"{name}: safetensors header is a JSON {type(parsed).__name__}, not an object"]
    problems: list[str] = []
    spans: list[tuple[int, int, str]] = []
    for tensor, info in parsed.items():
        if tensor == "__metadata__":
            continue
        span = _offsets(info)
        if span is None:
            problems.append(f"{name}: tensor {tensor} has no valid data_offsets")
            continue
        begin, end = span
        if end > data:
            problems.append(
                f"{name}: tensor {tensor} ends at byte {end} but the file holds {data} bytes of "
                "data after its header (truncated?)"
            )
        want = _tensor_bytes(info)
        if want is not None and want != end - begin:
            problems.append(
                f"{name}: tensor {tensor} ({info.get('dtype')} {info.get('shape')}) needs {want} "
                f"bytes, its data_offsets span {end - begin}"
            )
        spans.append((begin, end, tensor))
    if not problems:
        at = 0
        for begin, end, tensor in sorted(spans):
            if begin != at:
                problems.append(
                    f"{name}: tensor {tensor} starts at byte {begin} of the data, not at {at} "
                    "(tensors overlap or leave a gap)"
                )
                break
            at = end
        else:
            if at != data:
                problems.append(
                    f"{name}: bytes {at}-{data} of its data are not covered by any tensor (the file "
                    "is longer than its header says)"
                )
    missing = sorted(set(indexed) - set(parsed))
    problems += [f"{name}: tensor {t} that {INDEX_NAME} places in it is not in its header" for t in missing[:3]]
    return problems
