"""structlog set-up: JSON lines for the agent (journald-friendly), quiet console lines for the CLI.

structlog is imported only by the modules that log (through ``get_logger``): a CLI query that
never reaches them does not pay for it. ``configure`` records the choice and applies it at once
when structlog is loaded already, else when the first logging module is imported.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import structlog

_chosen: dict[str, Any] | None = None  # configure()'s arguments, until applied


# Libraries that log through the standard library: at the chosen level too, so that the CLI's quiet
# default does not print paramiko's traceback of a failed connect beside the one error it maps.
LIBRARY_LOGGERS = ("paramiko",)


def configure(*, json: bool, level: int = logging.INFO) -> None:
    global _chosen
    _chosen = {"json": json, "level": level}
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(level)
    if "structlog" in sys.modules:
        _apply()


def get_logger() -> structlog.typing.FilteringBoundLogger:
    """A module's logger; the configuration chosen before it was first needed is applied now."""
    import structlog

    if _chosen is not None:
        _apply()
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger()
    return logger


def _apply() -> None:
    global _chosen
    import structlog

    chosen, _chosen = _chosen, None
    if chosen is None:
        return
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if chosen["json"] else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(chosen["level"]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
