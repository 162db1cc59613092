"""What is specific to the inference engine a model runs on, behind one interface (pure: no I/O).

An engine says how to start a model (its command line and environment), how its systemd units are named
and how to tell its processes by their cgroup, which platform a command line runs on, whether a unit
runs with sleep mode and which HTTP paths control the engine (the front proxy refuses them), where
readiness is probed, and which log lines carry its own reason for failing. vLLM (``engines/vllm.py``)
is the one implementation; a second engine is one more module beside it, one entry in ``ENGINES``, plus
its tests.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.engines.base import CommandLine, Engine, Launch, LoadRules, Option, RenderedFlags, SleepApi
from orchestrator.engines.vllm import VLLM
from orchestrator.errors import UsageError

# The engine a model runs on when nothing names another (every model today).
ENGINE: Engine = VLLM
# Every engine, by the name a recorded unit spec keeps (UnitSpec.engine): the adapters of each (its
# sleep-mode control) are chosen once per host from this table (orchestrator.wiring).
ENGINES: Mapping[str, Engine] = {e.name: e for e in (VLLM,)}


def engine_of_cgroup(cgroup: bytes) -> Engine | None:
    """The engine whose units a process runs in, from its /proc/PID/cgroup; None: none of them."""
    return next((e for e in ENGINES.values() if e.owns_cgroup(cgroup)), None)


def engine_running(argv: tuple[str, ...] | list[str]) -> Engine | None:
    """The engine whose server ``argv`` starts (adopt: a command line found on a box); None: none's."""
    return next((e for e in ENGINES.values() if e.command_line.engine_length(argv) is not None), None)


def engine_named(name: str) -> Engine:
    """The engine called ``name`` (a recorded unit spec's), else UsageError naming the known ones."""
    try:
        return ENGINES[name]
    except KeyError:
        raise UsageError(f"engine {name!r} is not known (known: {', '.join(sorted(ENGINES))})") from None


__all__ = [
    "ENGINE",
    "ENGINES",
    "VLLM",
    "CommandLine",
    "Engine",
    "Launch",
    "LoadRules",
    "Option",
    "RenderedFlags",
    "SleepApi",
    "engine_named",
    "engine_of_cgroup",
    "engine_running",
]
