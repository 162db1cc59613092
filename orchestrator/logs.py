"""structlog set-up: JSON lines for the agent (journald-friendly), quiet console lines for the CLI."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(*, json: bool, level: int = logging.INFO) -> None:
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (structlog.processors.JSONRenderer() if json
                                            else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
