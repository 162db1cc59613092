"""One operation per host at a time, across threads and processes (flock on a per-host file)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from orchestrator.errors import Busy


@contextmanager
def host_lock(state_dir: str, host: str, describe_holder: str = "") -> Iterator[None]:
    """Hold the host's lock for the block; raise Busy at once when someone else holds it."""
    lock_dir = Path(state_dir) / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_dir / f"{host}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(f"host {host} is busy: {describe_holder or 'another operation is running'}; "
                       "wait for it (orchestrator status --follow) or try again later", host=host) from None
        yield
    finally:
        os.close(fd)


def host_held(state_dir: str, host: str) -> bool | None:
    """Whether an operation holds the host's lock now (None: the lock file cannot be opened here). An
    unfinished deployment on a host nobody holds was interrupted: nothing drives it until a recovery."""
    try:
        fd = os.open(Path(state_dir) / "locks" / f"{host}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
