"""The engine's own reason, found in its journal above the shutdown lines that end it."""

from __future__ import annotations

from orchestrator.core.health import engine_errors

# Shaped like vLLM 0.32 (CPU) serving tiny-unservable: the reason, then ~15 lines of orderly shutdown.
JOURNAL = [
    "(APIServer pid=291) INFO 11-30 19:58:30 [api_server.py:1] vLLM API server version 0.32.0",
    "(APIServer pid=291) WARNING 11-30 19:58:31 [__init__.py:9] ModuleNotFoundError: No module named 'flash'",
    "(EngineCore pid=312) ERROR 11-30 19:59:00 [core.py:1] EngineCore encountered a fatal error.",
    "(EngineCore pid=312) Traceback (most recent call last):",
    '(EngineCore pid=312)   File "/opt/vllm-cpu/lib/python3.11/site-packages/vllm/attention.py", line 9, in f',
    "(EngineCore pid=312) RuntimeError: Unsupported CPU attention configuration: head_dim=16 " + "x" * 400,
    (
        "(APIServer pid=291) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack "
        "trace (above) for the root cause."
    ),
    "INFO:     Shutting down",
    "(APIServer pid=291) INFO 11-30 19:59:01 [core_client.py:777] [shutdown] MPClient: complete",
    "  warnings.warn('resource_tracker: There appear to be %d '",
]


def test_the_reason_above_the_shutdown_is_named_and_trimmed() -> None:
    """The RuntimeError and the EngineDeadError are returned in order, each cut to the width."""
    errors = engine_errors(JOURNAL, limit=2, width=80)
    runtime = "RuntimeError: Unsupported CPU attention configuration: head_dim=16 " + "x" * 400
    dead = "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace"
    assert errors == [runtime[:80] + " [...]", dead[:80] + " [...]"]


def test_startup_noise_gives_way_to_the_last_errors() -> None:
    """With a limit, the newest distinct exceptions win over older start-up warnings."""
    assert all("ModuleNotFoundError" not in e for e in engine_errors(JOURNAL, limit=2))
    assert engine_errors(JOURNAL, limit=3)[0].startswith("ModuleNotFoundError: No module named")


def test_a_clean_log_has_no_error() -> None:
    """Log lines that merely mention an error are not exceptions."""
    assert engine_errors(["INFO: EngineCore encountered a fatal error.", "ERROR 11-30 startup failed"]) == []
