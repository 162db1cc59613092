"""The real CLI in this process (click's runner), leaving structlog's configuration as it found it:
`main` configures logging for the process, which would silence the log capture of later tests."""

from __future__ import annotations

import structlog
from click.testing import CliRunner, Result

from orchestrator.cli import main


def invoke(*args: str) -> Result:
    saved = structlog.get_config()
    try:
        return CliRunner().invoke(main, list(args))
    finally:
        structlog.configure(**saved)
