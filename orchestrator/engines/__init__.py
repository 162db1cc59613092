"""What is specific to the inference engine a model runs on, behind one interface (pure: no I/O).

An engine says how to start a model (its command line and environment), how its systemd units are named
and how to tell its processes by their cgroup, which platform a command line runs on, whether a unit
runs with sleep mode and which HTTP paths control the engine (the front proxy refuses them), where
readiness is probed, and which log lines carry its own reason for failing. vLLM (``engines/vllm.py``)
is the one implementation; a second engine is one more module beside it, plus its tests.
"""

from __future__ import annotations

from orchestrator.engines.base import Engine, Launch, SleepApi
from orchestrator.engines.vllm import VLLM

# The engine every model runs on (a second one would be chosen per model, by name, here).
ENGINE: Engine = VLLM

__all__ = ["ENGINE", "VLLM", "Engine", "Launch", "SleepApi"]
