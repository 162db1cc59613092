"""The locks on a box's state dir, across threads and processes (flock on a file in its locks/).

``host_lock``: one operation per host at a time (switch, stop, rollback, recover). ``activity_lock``:
one bench, tune run or staging per box at a time, beside the host's lock (a tune run switches between
its benches; staging runs while a model serves); its file says what holds it and since when, for the
Busy of a second one and for the on-demand broker (``activity_holder``), which waits for a bench or a
tune run.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.errors import Busy

WAIT = "wait for it (orchestrator status --follow) or try again later"


def _open(state_dir: str, name: str) -> int:
    lock_dir = Path(state_dir) / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    return os.open(lock_dir / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def host_lock(state_dir: str, host: str, describe_holder: str = "") -> Iterator[None]:
    """Hold the host's lock for the block; raise Busy at once when someone else holds it."""
    fd = _open(state_dir, host)
    try:
        if not _try_flock(fd):
            raise Busy(f"host {host} is busy: {describe_holder or 'another operation is running'}; {WAIT}", host=host)
        yield
    finally:
        os.close(fd)


@contextmanager
def activity_lock(state_dir: str, box: str, activity: str, doing: str) -> Iterator[None]:
    """Hold ``box``'s ``activity`` lock (bench, tune, stage) for the block, recording ``doing`` ("a bench
    of M is running") and the time; a second one is Busy at once: "host BOX: busy, DOING since T"."""
    fd = _open(state_dir, f"{box}.{activity}")
    try:
        if not _try_flock(fd):
            raise Busy(f"busy, {_described(fd, activity)}; {WAIT}", host=box)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"doing": doing, "since": time.time(), "pid": os.getpid()}).encode(), 0)
        yield
    finally:
        os.close(fd)


def activity_holder(state_dir: str, box: str, activity: str) -> str | None:
    """What holds ``box``'s ``activity`` lock ("a bench of M is running since T"), None when nothing
    does. Read from /proc/locks, not by trying the lock: a try of our own could make the holder's
    next non-blocking one fail for that instant."""
    path = Path(state_dir) / "locks" / f"{box}.{activity}.lock"
    if not _flocked(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _described(fd, activity)
    finally:
        os.close(fd)


def _described(fd: int, activity: str) -> str:
    """The holder's record; a record not written yet (the instant after its flock) or unreadable: the
    activity alone."""
    try:
        held = json.loads(os.pread(fd, 4096, 0))
        since = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(float(held["since"])))
        return f"{held['doing']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"a {activity} is running"


def host_held(state_dir: str, host: str) -> bool | None:
    """Whether an operation holds the host's lock now (None: the lock file cannot be read here). An
    unfinished deployment on a host nobody holds was interrupted: nothing drives it until a recovery.
    Read from /proc/locks, not by trying the lock: a try of our own could make a starting operation's
    non-blocking lock fail for that instant (a `status` turning a switch away as busy)."""
    path = Path(state_dir) / "locks" / f"{host}.lock"
    if not path.exists():
        return False
    return _flocked(path)


def _flocked(path: Path) -> bool | None:
    """Whether any process holds a flock on ``path`` (None: it or /proc/locks cannot be read)."""
    try:
        names = _lock_names(path)
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    return any(
        f[1:2] == ["FLOCK"] and f[5] in names for f in (line.split() for line in text.splitlines()) if len(f) > 5
    )


def _lock_names(path: Path) -> set[str]:
    """How /proc/locks may name the file: "dev:ino" of the inode its locks are kept on, the device
    that of the superblock. On overlayfs (Docker, Kubernetes, systemd-nspawn roots) stat's st_dev is a
    layer's, not the overlay's, so the device comes from the mount of an fd on the file too
    (/proc/self/fdinfo's mnt_id and ino, the mount's device in /proc/self/mountinfo)."""
    st = os.stat(path)
    names = {_name(os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)}
    fd = os.open(path, os.O_PATH)
    try:
        info = dict(
            line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines() if ":" in line
        )
    finally:
        os.close(fd)
    mount, ino = info.get("mnt_id", "").strip(), info.get("ino", str(st.st_ino)).strip()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[:1] == [mount] and len(fields) > 2 and ino.isdigit():
            major, _, minor = fields[2].partition(":")
            names.add(_name(int(major), int(minor), int(ino)))
            break
    return names


def _name(major: int, minor: int, ino: int) -> str:
    return f"{major:02x}:{minor:02x}:{ino}"  # as fs/locks.c prints it
