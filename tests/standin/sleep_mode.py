"""vLLM 0.25.1's sleep mode for the stand-in engine (stdlib only), as its source and the H200 runs show.

Source: vllm/entrypoints/serve/dev/sleep/api_router.py (the routes, attached only with
VLLM_SERVER_DEV_MODE=1), v1/engine/core.py (sleep = pause the scheduler, then the executor; wake =
the executor, then resume once no tag sleeps), v1/executor/abstract.py (sleeping tags, the warnings
that turn a repeated sleep or wake into a no-op) and device_allocator/cumem.py (what is freed).
Measured on the H200 (bench/gpu/, ../shared/notes/gpu.md): the residue a sleeper keeps, the wake
that finds the memory taken (500 out of memory, half-woken, then 500 invalid argument for good),
/health 200 and held completions while asleep.

Without --enable-sleep-mode the dev routes still exist (vLLM attaches them on the env alone) but the
cumem pool holds nothing, so /sleep answers 200 and frees nothing: the same symptom as the public
reports of a sleep that keeps GBs (vllm#47654), which ``keeps_memory`` also models.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nvidia_smi import load_gpus, load_holders  # a sibling script, not a package

OOM = "Call to wake_up method failed: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163"
INVALID = "Call to wake_up method failed: CUDA Error: invalid argument at /workspace/csrc/cumem_allocator.cpp:169"
TAGS = ("weights", "kv_cache")
MODES = ("abort", "wait", "keep")
# m8 on the H200: 1,816-1,844 MiB after a level-1 or level-2 sleep (m1: 1,238 MiB).
RESIDUE_MIB = 1816


class SleepError(Exception):
    """The engine's own words, answered as HTTP 500 (InternalServerError) by the API server."""


class Memory:
    """The engine's memory on its GPUs, in the files the stand-in nvidia-smi reads."""

    def __init__(self, gpu_dir: str, gpus: list[int], write: Callable[[int], None]) -> None:
        self.gpu_dir, self.gpus, self.write = gpu_dir, gpus, write

    def free_mib(self, me: int) -> int:
        """The least memory over this engine's GPUs that no live process but ``me`` holds."""
        spec = load_gpus(self.gpu_dir)
        count, total = int(str(spec["count"])), int(str(spec["memory_mib"]))
        holders = load_holders(count, self.gpu_dir)
        return min(
            (total - sum(m for g, pid, _, m in holders if g == gpu and pid != me) for gpu in self.gpus), default=total
        )


class SleepMode:
    """Scheduler pause + executor sleep of one engine; completions ask it when they may run."""

    def __init__(
        self,
        *,
        enabled: bool,
        full_mib: int,
        weights_mib: int,
        residue_mib: int,
        sleep_time: float,
        first_sleep_time: float | None,
        wake_time: float,
        reload_time: float,
        keeps_memory: bool,
        memory: Memory | None,
        holder: Callable[[], int],
        log: Callable[[str], None],
    ) -> None:
        self.enabled, self.keeps_memory = enabled, keeps_memory
        self.full_mib, self.weights_mib, self.residue_mib = full_mib, weights_mib, residue_mib
        self.sleep_time, self.wake_time, self.reload_time = sleep_time, wake_time, reload_time
        self.first_sleep_time = sleep_time if first_sleep_time is None else first_sleep_time
        self.memory, self.holder, self.log = memory, holder, log
        self.held_mib = full_mib
        self.running = asyncio.Event()  # the scheduler steps: cleared while paused
        self.running.set()
        self.pause_mode = ""
        self.abort_epoch = 0  # a mode=abort sleep bumps it: streams of an older epoch end "abort"
        self.inflight = 0
        self.held = 0  # requests queued while paused
        self.idle = asyncio.Event()
        self.idle.set()
        self.sleeping_tags: set[str] = set()
        self.weights_valid = True  # False after a level-2 sleep until reload_weights
        self.wedged = False
        self.slept_once = False

    # ---- what completions see ----

    def is_sleeping(self) -> bool:
        return not self.running.is_set() or bool(self.sleeping_tags)

    async def admit(self) -> int:
        """Wait while paused (a request to a sleeping engine is queued, no error), then count it."""
        if not self.running.is_set():
            self.held += 1
            try:
                while not self.running.is_set():
                    await self.running.wait()
            finally:
                self.held -= 1
        self.inflight += 1
        self.idle.clear()
        return self.abort_epoch

    def done(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self.idle.set()

    async def step(self, epoch: int) -> bool:
        """Before each token: False once aborted; a mode=keep pause freezes the request here."""
        while not self.running.is_set() and self.pause_mode == "keep":
            await self.running.wait()
        return epoch == self.abort_epoch

    # ---- the dev endpoints ----

    async def sleep(self, level: int, mode: str) -> None:
        if mode not in MODES:
            raise SleepError(f"Call to sleep method failed: Invalid pause mode: {mode}")
        self.pause_mode = mode
        self.running.clear()
        if mode == "abort":
            self.abort_epoch += 1
        elif mode == "wait":
            self.log("Waiting for in-flight requests to complete before sleeping...")
            await self.idle.wait()
        if level < 1:
            return
        if self.sleeping_tags:
            self.log("WARNING Executor is already sleeping.")
            return
        took = self.first_sleep_time if not self.slept_once else self.sleep_time
        self.slept_once = True
        before = self.held_mib
        await asyncio.sleep(took)
        if self.enabled and not self.keeps_memory:
            self.set_held(self.residue_mib)
        self.sleeping_tags = set(TAGS)
        if level >= 2:
            self.weights_valid = False
        self.log(
            f"Sleep mode freed {(before - self.held_mib) / 1024:.2f} GiB memory, "
            f"{self.held_mib / 1024:.2f} GiB memory is still in use."
        )
        self.log(f"It took {took:.6f} seconds to fall asleep.")

    async def wake_up(self, tags: list[str] | None) -> None:
        if tags is not None and "scheduling" in tags:
            tags = [t for t in tags if t != "scheduling"]
        if tags is None or tags:
            await self.wake_executor(tags)
        if not self.sleeping_tags:
            self.pause_mode = ""
            self.running.set()

    async def wake_executor(self, tags: list[str] | None) -> None:
        if not self.sleeping_tags:
            self.log("WARNING Executor is not sleeping.")
            return
        for tag in tags or ():
            if tag not in self.sleeping_tags:
                self.log(f"WARNING Tag {tag} is not in sleeping tags {self.sleeping_tags}")
                return
        waking = set(tags) if tags else set(self.sleeping_tags)
        if self.wedged:
            raise SleepError(INVALID)
        target = self.target_mib(self.sleeping_tags - waking)
        if self.memory is not None and self.enabled and not self.keeps_memory:
            room = self.memory.free_mib(self.holder())  # all but what the other processes hold
            if room < target:  # half-woken: it keeps what it mapped before the failed map
                self.set_held(max(room, self.held_mib))
                self.wedged = True
                raise SleepError(OOM)
        started = time.monotonic()
        await asyncio.sleep(self.wake_time)
        if self.enabled and not self.keeps_memory:
            self.set_held(target)
        self.sleeping_tags -= waking
        self.log(f"It took {time.monotonic() - started:.6f} seconds to wake up tags {waking}.")

    def target_mib(self, still_sleeping: set[str]) -> int:
        kv = max(self.full_mib - self.residue_mib - self.weights_mib, 0)
        return (
            self.residue_mib
            + (0 if "weights" in still_sleeping else self.weights_mib)
            + (0 if "kv_cache" in still_sleeping else kv)
        )

    async def reload_weights(self) -> None:
        """collective_rpc reload_weights: the level-2 wake's middle step (from disk, 3.04 s for m8)."""
        if "weights" in self.sleeping_tags:
            raise SleepError(
                "Call to collective_rpc method failed: reload_weights while the weights "
                "are asleep (stand-in: wake_up?tags=weights first)"
            )
        await asyncio.sleep(self.reload_time)
        self.weights_valid = True

    def set_held(self, mib: int) -> None:
        self.held_mib = mib
        if self.memory is not None:
            self.memory.write(mib)
