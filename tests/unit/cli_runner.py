"""The real CLI in this process (click's runner), leaving structlog's configuration as it found it:
`main` configures logging for the process, which would silence the log capture of later tests."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

import structlog
from click.testing import CliRunner, Result

from orchestrator.cli import main
from orchestrator.logs import LIBRARY_LOGGERS


def invoke(*args: str) -> Result:
    saved = structlog.get_config()
    try:
        return CliRunner().invoke(main, list(args))
    finally:
        structlog.configure(**saved)


@contextlib.contextmanager
def _process_state(env: Mapping[str, str] | None, cwd: Path | str | None) -> Iterator[None]:
    """What a CLI run may change in this process, put back after it: the environment (replaced by
    ``env`` as subprocess's ``env`` does), the working directory, structlog's and the libraries' logging."""
    saved_env, saved_log = dict(os.environ), structlog.get_config()
    saved_levels = {name: logging.getLogger(name).level for name in LIBRARY_LOGGERS}
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with contextlib.chdir(cwd or os.getcwd()):
            yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        structlog.configure(**saved_log)
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def run(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | str | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m orchestrator ARGS` as its subprocess would end (exit status, stdout, stderr, an
    uncaught exception's traceback on stderr), run in this process: for tests of what the CLI prints
    and exits with, not of how it starts (tests/unit/test_cli_start.py), a start costing ~0.35 s of CPU."""
    with _process_state(env, cwd):
        result = CliRunner().invoke(main, list(args), prog_name="python -m orchestrator")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["python", "-m", "orchestrator", *args], result.exit_code, result.stdout, stderr)
