"""The words of a warm step's progress event, shared by the CLI's progress lines and the dashboard's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class _Blank(dict[str, Any]):
    """Fields for a progress line: a field an older agent did not send reads as empty."""

    def __missing__(self, key: str) -> str:
        return ""


# What the warm steps did, as one line each (deploy/warm_steps.py, sleep_stop.py and warm_rollback.py emit
# these with the engine's words), and the style the CLI prints it in.
WARM_LINES: dict[str, tuple[str, str]] = {
    "quiet": ("waited {seconds} s for a moment with no request in flight to {engines}: {result}", ""),
    "drained": ("what the proxy had in flight to {engines} finished ({seconds} s)", ""),
    "weights_in_ram": ("{model}'s weights are in host RAM as it loaded them (asleep, level1): not staged again", ""),
    "slept": ("{model} sleeps ({level}, {seconds} s)", ""),
    "woken": ("{model} woke and answered a completion ({seconds} s)", "green"),
    "wake_fits": ("GPUs {gpus} have the memory {model}'s wake takes: it may wake", ""),
    "stopping": ("{model} stops: {reason}", ""),
    "evicted": ("{model} (asleep) is stopped: {reason}", "yellow"),
    "sleep_failed": ("{model}'s sleep failed, {then}: {error}", "yellow"),
    "restart_wedged": ("{model} is wedged: killing {unit} and starting it cold", "yellow"),
    "wake_failed": ("{model}'s wake failed, {then}: {error}", "yellow"),
}


def warm_line(event: str, fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """A warm step's event as (text, style); None for any other event."""
    if event not in WARM_LINES:
        return None
    text, style = WARM_LINES[event]
    return text.format_map(_Blank(fields)), style
