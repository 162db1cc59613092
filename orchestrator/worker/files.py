"""File and output helpers of the stage worker (``orchestrator.worker.stage``) and its sources.

``emit`` writes the worker's JSON lines with every registered secret scrubbed; the rest measures,
reads and durably writes the files of a model directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from orchestrator import userfiles
from orchestrator.core.weights import INDEX_NAME, MANIFEST_NAME, PART_SUFFIX, Manifest, check_file_name
from orchestrator.errors import WeightsError

_SECRETS: list[str] = []
_OUT_LOCK = threading.Lock()
_CURRENT = {"file": ""}  # the file being fetched, for progress lines


def emit(event: str, **fields: object) -> None:
    """One JSON line on stdout, with every known secret replaced."""
    line = json.dumps({"event": event, **fields}, sort_keys=True)
    for secret in _SECRETS:
        line = line.replace(secret, "***")
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def set_current_file(name: str) -> None:
    """Name the file a source is fetching now; progress lines report it."""
    _CURRENT["file"] = name


def current_file() -> str:
    return _CURRENT["file"]


def load_token(token_file: str | None) -> str | None:
    """The hub token from a root-only file, else HF_TOKEN, else none (public repos); registered
    for scrubbing. A missing file is no token; an unreadable or world-readable one is an error."""
    token: str | None = None
    if token_file and os.path.exists(token_file):
        try:
            st = os.stat(token_file)
            if st.st_mode & 0o077:
                raise WeightsError(
                    f"token file {token_file} has mode {stat.S_IMODE(st.st_mode):o}; "
                    "it must be readable by its owner only (chmod 600)"
                )
            token = Path(token_file).read_text().strip() or None
        except OSError as exc:
            raise WeightsError(f"token file {token_file} cannot be read: {exc.strerror}") from exc
    token = token or os.environ.get("HF_TOKEN") or None
    if token:
        _SECRETS.append(token)
    return token


def dir_sizes(base: Path, *, parts: bool = False) -> dict[str, int]:
    """Relative path -> size of the model files under base (hidden top-level entries skipped).
    With ``parts``, a ``.part`` file counts under its final name (bytes a resume keeps)."""
    sizes: dict[str, int] = {}
    if not base.is_dir():
        return sizes
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = Path(dirpath).relative_to(base)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            rel = (rel_dir / fn).as_posix()
            if rel_dir == Path(".") and fn.startswith("."):
                continue
            try:
                size = os.stat(os.path.join(dirpath, fn)).st_size
            except FileNotFoundError:  # a dangling symlink (a cache blob deleted): the file is missing
                continue
            if fn.endswith(PART_SUFFIX):
                if parts:
                    sizes.setdefault(rel[: -len(PART_SUFFIX)], size)
            else:
                sizes[rel] = size
    return sizes


def tree_bytes(base: Path) -> int:
    return sum(os.stat(os.path.join(d, f)).st_size for d, _, fs in os.walk(base) for f in fs)


def free_bytes(path: str) -> int:
    """Bytes available to root under path (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def write_atomic(path: Path, data: bytes) -> None:
    userfiles.write_atomic(path, data)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def inside(base: Path, name: str, *, repo: str, where: str) -> Path:
    """``base / name`` once it is sure to stay under base: the pure name rule, then the path as the
    disk resolves it (a symlink already under base may point anywhere). Call before any write or
    unlink of that path."""
    check_file_name(name, repo=repo, where=where)
    real_base = os.path.realpath(base)
    real = os.path.realpath(base / name)
    if os.path.commonpath([real_base, real]) != real_base or real == real_base:
        raise WeightsError(
            f"{where}: file name {name!r} listed for {repo} resolves to {real}, outside "
            f"{base} (through a symlink); refusing to stage it"
        )
    return base / name


class HashingWriter:
    """A file object for ``http_get`` that hashes what it writes, so a download is verified without
    reading it back. The hash covers bytes [0, tell()); a seek backwards or a truncate (the server
    ignored a Range header and the download starts over) re-hashes the kept prefix from disk."""

    def __init__(self, f: BinaryIO, *, have: int = 0) -> None:
        self.f = f
        self.h = hashlib.sha256()
        self._hashed = 0
        self._rehash(have)

    def _rehash(self, upto: int) -> None:
        self.h, self._hashed = hashlib.sha256(), 0
        self.f.seek(0)
        while self._hashed < upto:
            chunk = self.f.read(min(1 << 24, upto - self._hashed))
            if not chunk:
                break
            self.h.update(chunk)
            self._hashed += len(chunk)
        self.f.seek(upto)

    def write(self, data: bytes) -> int:
        n = self.f.write(data)
        self.h.update(data)
        self._hashed += n
        return n

    def tell(self) -> int:
        return self.f.tell()

    def seek(self, offset: int, whence: int = 0) -> int:
        pos = self.f.seek(offset, whence)
        if pos != self._hashed:
            self._rehash(pos)
        return pos

    def truncate(self, size: int | None = None) -> int:
        size = self.f.tell() if size is None else size
        n = self.f.truncate(size)
        if size < self._hashed:
            self._rehash(size)
        return n

    def flush(self) -> None:
        self.f.flush()

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def read_index(base: Path, files: Mapping[str, int]) -> object | None:
    """The parsed shard index under base when the listing has one."""
    if INDEX_NAME not in files:
        return None
    try:
        index: object = json.loads((base / INDEX_NAME).read_text())
        return index
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{base}: {INDEX_NAME} cannot be read: {exc}") from exc


def read_manifest(model_dir: Path) -> Manifest | None:
    try:
        raw = (model_dir / MANIFEST_NAME).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightsError(f"{model_dir}: manifest cannot be read: {exc.strerror}") from exc
    try:
        return Manifest.from_dict(json.loads(raw))
    except ValueError as exc:
        raise WeightsError(f"{model_dir}: manifest is not JSON: {exc}") from exc
