"""Run a function in a forked child that has dropped to another account for good (as HAProxy's workers
and a non-root operator do), and return the text it reports."""

from __future__ import annotations

import os
from collections.abc import Callable


def run_as(uid: int, gid: int, work: Callable[[], str]) -> str:
    """``work()``'s text, computed in a child with only ``uid``/``gid`` (no supplementary groups)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, report, never return into the test runner
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.write(write, work().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return data
