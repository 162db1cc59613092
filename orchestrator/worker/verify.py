"""One verification of a model directory, whatever its source (hub, local copy, peer, or a ``local:``
directory used in place), before anything stops.

Checked: the listing against model.safetensors.index.json (every shard it names is there, with the
size the listing gives), every safetensors file's header (its 8-byte length, the JSON, tensor
offsets that tile the file: cheap, the header only), then the sha256 of each file whose digest is
known: from the source's listing (hub), a manifest (a staged revision, or one a peer or local copy
came from) or a Hugging Face cache's blob names. Without a known sha256 a flipped byte in tensor
data cannot be seen; the result says what was checked.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.core.safetensors_format import header_length_problem, safetensors_problems
from orchestrator.core.weights import (
    INDEX_NAME,
    check_file_names,
    in_place_problems,
    index_tensors,
    listing_problems,
)
from orchestrator.errors import WeightsError
from orchestrator.worker.files import dir_sizes, read_index, read_manifest, sha256_file

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Verified:
    files: int
    bytes: int
    sha256_checked: int
    checked: str  # what was checked, in words, for progress and logs

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def cache_blob_sha256(base: Path, names: Collection[str]) -> dict[str, str]:
    """sha256 of files that are symlinks into a Hugging Face cache's blobs/ (LFS blobs are named by it)."""
    known = {}
    for name in names:
        path = base / name
        if path.is_symlink() and _SHA256.fullmatch(path.resolve().name):
            known[name] = path.resolve().name
    return known


def header_problems(path: Path, name: str, indexed: Collection[str]) -> list[str]:
    """What is wrong with one safetensors file's header (reads the header only)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
            problem = header_length_problem(name, size, length)
            if problem is not None:
                return [problem]
            return safetensors_problems(name, size, f.read(length), indexed)
    except OSError as exc:
        return [f"{name}: cannot be read: {exc.strerror}"]


def verify_model(
    base: Path,
    *,
    where: str,
    expected: Mapping[str, int] | None = None,
    sha256: Mapping[str, str] | None = None,
    already_hashed: Collection[str] = (),
) -> Verified:
    """Raise WeightsError naming every bad file under ``base``; ``expected`` is the source's listing
    (None: a directory used in place, whose own files are the listing), ``sha256`` the digests known
    for it, ``already_hashed`` files hashed while they were fetched."""
    present = dir_sizes(base)
    listing = dict(expected) if expected is not None else present
    index = read_index(base, listing)
    problems = (
        listing_problems(listing, present, index, where=where)
        if expected is not None
        else in_place_problems(present, index, where=where)
    )
    tensors = index_tensors(index)
    safetensors = [n for n in sorted(listing) if n.endswith(".safetensors") and present.get(n) == listing[n]]
    for name in safetensors:
        problems += [f"{where}: {p}" for p in header_problems(base / name, name, tensors.get(name, ()))]
    known = {n: d for n, d in (sha256 or {}).items() if n in listing and n not in already_hashed}
    what = (
        f"{len(listing)} files: {'sizes and shards against ' + INDEX_NAME if index is not None else 'sizes'}, "
        f"{len(safetensors)} safetensors headers, "
    )
    what += (
        f"sha256 of {len(known) + len(already_hashed)}"
        if known or already_hashed
        else "no sha256 known (no manifest, no hub listing, not a hub cache snapshot): a flipped byte in "
        "tensor data is not detectable"
    )
    if problems:
        raise WeightsError("; ".join(problems) + f" (checked {what})")
    for name, digest in sorted(known.items()):
        actual = sha256_file(base / name)
        if actual != digest:
            problems.append(f"{where}: {name} failed its sha256 check (expected {digest}, found {actual})")
    if problems:
        raise WeightsError("; ".join(problems) + f" (checked {what})")
    hashed = len(known) + len(set(already_hashed) & set(listing))
    return Verified(files=len(listing), bytes=sum(listing.values()), sha256_checked=hashed, checked=what)


def verify_in_place(base: Path, *, where: str) -> Verified:
    """A ``local:`` directory as it is: its manifest's listing and digests when it has one (a staged
    revision), else its own files, with the digests a hub cache's blob names give."""
    if not base.is_dir():
        raise WeightsError(f"{where}: {base} is not a directory")
    manifest = read_manifest(base)
    if manifest is None:
        return verify_model(base, where=where, sha256=cache_blob_sha256(base, dir_sizes(base)))
    check_file_names([*manifest.files, *manifest.sha256], repo=manifest.repo, where=where)  # never read outside
    if (
        manifest.index_sha256 is not None
        and INDEX_NAME in manifest.files
        and (base / INDEX_NAME).is_file()
        and sha256_file(base / INDEX_NAME) != manifest.index_sha256
    ):
        raise WeightsError(f"{where}: {INDEX_NAME} changed since it was staged (its sha256 is not the manifest's)")
    return verify_model(base, where=where, expected=manifest.files, sha256=manifest.sha256)
