"""Files at paths a user gave: read bounded and never blocking, written through an unguessable temporary.

Every file the tool reads on user input (deploy.toml, a model's config.json, --template, hosts.toml,
known_hosts, the relay's config) goes through :func:`read_bytes`: opened with O_NONBLOCK (a FIFO
with no writer cannot hang the CLI, or wedge one of the agent's connection slots), checked with
fstat on the open descriptor to be a regular file (``/dev/zero``, a FIFO, a socket or a directory
is refused by name), and read up to a cap (a huge or growing file cannot exhaust memory). Failures
are OSError with ``strerror`` saying what is wrong, so each caller's existing "cannot read: ..."
message names the file and the reason. Standard library only: the relay imports it.

Every file written through a temporary name goes through :func:`write_atomic`: the temporary is
created by mkstemp in the target's directory (O_CREAT|O_EXCL|O_NOFOLLOW, a random name, mode 0600),
so a symlink planted at a predictable name (``unit.tmp``) can never redirect the write; it is
fsynced, given its mode, then renamed over the target (which replaces a symlink there, never
follows it).
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

MAX_BYTES = 16 * 1024 * 1024  # far above any deploy.toml, config.json or known_hosts

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotARegularFile(OSError):
    """The path names something other than a regular file, or one larger than the cap."""


def _refuse(path: str, reason: str) -> NotARegularFile:
    return NotARegularFile(errno.EINVAL, reason, path)


def read_bytes(path: str | os.PathLike[str], *, limit: int = MAX_BYTES) -> bytes:
    """The whole content of the regular file at ``path``, at most ``limit`` bytes."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check(name, os.fstat(fd), limit)
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:  # it grew while we read it
                raise _refuse(name, f"more than the {limit} bytes a file read here may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular(path: str | os.PathLike[str], *, limit: int = MAX_BYTES) -> None:
    """Refuse, as :func:`read_bytes` would, a path that a library is about to open itself (an SSH key)."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check(name, os.fstat(fd), limit)
    finally:
        os.close(fd)


def _check(name: str, st: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise _refuse(name, f"{kind}, not a regular file")
    if st.st_size > limit:
        raise _refuse(name, f"{st.st_size} bytes, more than the {limit} a file read here may have")


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_BYTES, encoding: str = "utf-8") -> str:
    """:func:`read_bytes` decoded (UnicodeDecodeError, a ValueError, when it is not ``encoding``)."""
    return read_bytes(path, limit=limit).decode(encoding)


def write_atomic(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically; no temporary is left behind on failure (OSError)."""
    name = os.fspath(path)
    directory = os.path.dirname(name) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(name)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, name)
    except BaseException:  # whatever stopped the write (Ctrl-C included) leaves no temporary; re-raised as it was
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)  # the rename itself survives a crash only once the directory is synced
    finally:
        os.close(dfd)
