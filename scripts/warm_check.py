"""engine_check's warm part: the product's sleep/wake code against two real vLLM engines on one GPU.

What runs is the product's own: ``deploy.warm`` (sleep_verified: sleep, then the GPU holds only the
residue, by PID; check_wake_fits: room for the wake on the GPU, counted in memory by PID;
wake_checked: vLLM's level-1 or level-2 wake sequence, then one real completion, else EngineWedged)
over ``adapters.engine_http.HttpEngineControl`` and ``adapters.nvidia_smi``. Only systemd is
replaced (scripts/process_units.py). Sequence, each step a ``CHECK`` line:

  A (the big model, --model-dir) starts with sleep mode; readiness; the load generator against
  `vllm bench serve` on it (bench/loadgen/vllm_compare.py, the strict comparison); A sleeps (its first sleep
  copies the weights to host RAM) and is verified; B (--warm-model-dir) starts beside the sleeper;
  SWAPS swaps B->A->B..., each timed (sleep + verify + wake + first completion = what a client waits
  through); A sleeps at level 2 and wakes by vLLM's level-2 sequence; then the wedge: A sleeps again,
  a third process takes memory, check_wake_fits must refuse B's wake naming that PID, the wake forced anyway must end
  in EngineWedged (vLLM: 500 out of memory, half-woken), and after the memory is back a second wake
  too (500 invalid argument: wedged for good); a stop frees B's memory by PID; A stops, GPU free.
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any

from orchestrator.adapters.clock import SystemClock
from orchestrator.adapters.engine_http import HttpEngineControl
from orchestrator.core.records import UnitSpec
from orchestrator.deploy import warm
from orchestrator.errors import EngineWedged, GpuBusy, OrchestratorError, SleepLeftMemory

HOG = (
    "import sys, torch\n"
    "x = torch.empty(int(sys.argv[1]) << 20, dtype=torch.uint8, device='cuda')\n"
    "print('holding', sys.argv[1], 'MiB', flush=True)\n"
    "sys.stdin.read()\n"
)


ec_split = shlex.split


class Warm:
    """Two engines' specs on one rig; ``ec`` is the engine_check module (say, check, gpu_state)."""

    def __init__(self, ec: Any, rig: Any, residue_mib: int, hog: str = "") -> None:
        self.ec, self.rig, self.residue = ec, rig, residue_mib
        self.hog = hog  # a command with {mib}: holds that much GPU memory until its stdin closes
        self.control = HttpEngineControl(sleep_timeout=120.0, wake_timeout=60.0)
        self.clock = SystemClock()
        self.swaps: list[dict[str, Any]] = []

    def engine(self, spec: UnitSpec, utilization: float) -> warm.EngineProcess:
        return warm.EngineProcess(
            name=spec.model,
            base_url=spec.base_url,
            gpus=tuple(spec.gpus),
            pids=frozenset(self.rig.units.cgroup_pids(spec.unit_name)),
            utilization=utilization,
            served=spec.served_name,
        )

    def smi(self, gpus: tuple[int, ...]) -> dict[int, int]:
        return warm.pids_holding(self.rig.gpus, gpus)

    def sleep(self, eng: warm.EngineProcess, level: int, label: str) -> float | None:
        try:
            took = warm.sleep_verified(
                self.control, self.rig.gpus, self.clock, eng, level=level, residue_mib=self.residue, mode="wait"
            )
        except (SleepLeftMemory, OrchestratorError) as exc:
            self.ec.check(label, False, str(exc)[:1500])
            return None
        held = warm.held_mib(self.rig.gpus, eng)
        self.ec.check(
            label,
            all(m <= self.residue for m in held.values()),
            f"{eng.name} sleep level {level} mode=wait answered in {took:.3f} s; now holds {held} MiB "
            f"by GPU (residue limit {self.residue} MiB); /is_sleeping "
            f"{self.control.is_sleeping(eng.base_url)}; GPU by PID {self.smi(eng.gpus)}",
        )
        return took

    def swap(self, off: warm.EngineProcess, on: warm.EngineProcess, i: int) -> None:
        """``off`` sleeps, ``on`` wakes and answers: the client-visible gap of a warm switch."""
        t0 = time.monotonic()
        try:
            slept = warm.sleep_verified(
                self.control, self.rig.gpus, self.clock, off, level=1, residue_mib=self.residue, mode="wait"
            )
            t1 = time.monotonic()
            warm.check_wake_fits(self.rig.gpus, on, sleepers={p: off.name for p in off.pids})
            t2 = time.monotonic()
            woke = warm.wake_checked(self.control, self.clock, on, level=1, deadline_s=30.0)
        except OrchestratorError as exc:
            self.ec.check(f"swap_{i}", False, f"{off.name} -> {on.name}: {exc}"[:1500])
            return
        t3 = time.monotonic()
        # sleep_s: the POST /sleep; slept_and_verified_s: with the residue check by PID after it;
        # fits_s: check_wake_fits' nvidia-smi read; then the wake and the first completion.
        row = {
            "swap": i,
            "from": off.name,
            "to": on.name,
            "sleep_s": round(slept, 3),
            "slept_and_verified_s": round(t1 - t0, 3),
            "fits_s": round(t2 - t1, 3),
            "wake_and_completion_s": round(woke, 3),
            "downtime_s": round(t3 - t0, 3),
            "gpu_by_pid": self.smi(on.gpus),
        }
        self.swaps.append(row)
        self.ec.check(f"swap_{i}", True, json.dumps(row))

    def level2(self, eng: warm.EngineProcess) -> None:
        if self.sleep(eng, 2, "sleep_level2") is None:
            return
        try:
            took = warm.wake_checked(self.control, self.clock, eng, level=2, deadline_s=60.0)
            self.ec.check(
                "wake_level2",
                True,
                f"{eng.name}: wake_up?tags=weights, collective_rpc reload_weights, "
                f"wake_up?tags=kv_cache, reset_prefix_cache and one completion in "
                f"{took:.3f} s; GPU by PID {self.smi(eng.gpus)}",
            )
        except OrchestratorError as exc:
            self.ec.check("wake_level2", False, str(exc)[:1500])

    def wedge(self, other: warm.EngineProcess, sleeper: warm.EngineProcess) -> None:
        """Both engines asleep, another process takes the memory ``sleeper`` needs; the product must
        refuse the wake naming that PID, and a forced wake must be found wedged, twice (vLLM's out of
        memory, then invalid argument)."""
        snap = self.rig.gpus.snapshot()
        gpu = sleeper.gpus[0]
        free = next(g.memory_free_mib for g in snap.gpus if g.index == gpu)
        need = warm.need_mib(snap, sleeper.gpus, sleeper.utilization) - sum(
            warm.held_mib(self.rig.gpus, sleeper).values()
        )
        take = max(free - need // 2, 1024)
        argv = ec_split(self.hog.format(mib=take)) if self.hog else [sys.executable, "-c", HOG, str(take)]
        hog = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert hog.stdout is not None
            line = hog.stdout.readline().strip()
            self.ec.say(
                f"wedge: pid {hog.pid} {line} ({free} MiB were free, {sleeper.name} needs {need} MiB more); "
                f"GPU by PID {self.smi(sleeper.gpus)}"
            )
            try:
                warm.check_wake_fits(self.rig.gpus, sleeper, sleepers={p: other.name for p in other.pids})
                self.ec.check("wake_refused_without_memory", False, "check_wake_fits let the wake go ahead")
            except GpuBusy as exc:
                self.ec.check("wake_refused_without_memory", str(hog.pid) in str(exc), str(exc)[:800])
            self.forced_wake(sleeper, "wedge_detected", "out of memory")
        finally:
            hog.kill()
            hog.wait()
        deadline = time.monotonic() + 15
        while hog.pid in self.smi(sleeper.gpus) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.ec.say(f"wedge: hog gone; {sleeper.name} holds {warm.held_mib(self.rig.gpus, sleeper)} MiB by GPU")
        self.forced_wake(sleeper, "wedged_for_good", "invalid argument")

    def forced_wake(self, eng: warm.EngineProcess, label: str, words: str) -> None:
        t = time.monotonic()
        try:
            warm.wake_checked(self.control, self.clock, eng, level=1, deadline_s=20.0)
            self.ec.check(label, False, f"{eng.name} woke and answered: not wedged")
        except EngineWedged as exc:
            self.ec.check(
                label,
                words in str(exc),
                f"EngineWedged after {time.monotonic() - t:.2f} s (status "
                f"{exc.status}): {str(exc)[:700]}; {eng.name} holds "
                f"{warm.held_mib(self.rig.gpus, eng)} MiB by GPU",
            )

    def stop_freed(self, spec: UnitSpec, eng: warm.EngineProcess, label: str) -> None:
        t = time.monotonic()
        self.rig.units.stop(spec.unit_name)
        deadline = time.monotonic() + 30
        while (held := warm.held_mib(self.rig.gpus, eng)) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.ec.check(
            label,
            not held,
            f"{spec.unit_name} stopped; its PIDs {sorted(eng.pids)} "
            f"hold {held or 'nothing'} {time.monotonic() - t:.2f} s later; "
            f"GPU by PID {self.smi(eng.gpus)}",
        )

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"swaps": self.swaps}
        for name in sorted({s["to"] for s in self.swaps}):
            d = [s["downtime_s"] for s in self.swaps if s["to"] == name]
            out[f"downtime_to_{name}"] = {"median_s": statistics.median(d), "max_s": max(d), "runs": d}
        return out


def start_big(ec: Any, rig: Any, a: Any, w: Warm, big: dict[str, Any]) -> tuple[Any, Any, warm.EngineProcess] | None:
    """A, ready; with --fallback-engine when it does not come up with --engine and --first-args
    (e.g. `vllm serve --api-server-count 4`, which the comparison wants and nothing here has proved)."""
    spec, ctx = rig.spec("wa", shlex.split(a.engine_args) + shlex.split(a.first_args), model=big)
    w.residue = int(rig.catalog_host_residue_mib)  # the host's sleep_residue_gib (default: measured)
    ec.check(
        "sleep_mode_rendered",
        warm.sleep_enabled(spec) and "VLLM_SERVER_DEV_MODE=1" in spec.unit_text,
        f'{spec.unit_name}: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 rendered for sleep = "level1"',
    )
    if ec.start_and_wait(rig, spec, ctx, None) is None:
        if not a.fallback_engine:
            return None
        ec.say(f"warm: {spec.unit_name} did not start; again with --fallback-engine {a.fallback_engine!r}")
        rig.units.stop(spec.unit_name)
        a.engine = a.fallback_engine
        spec, ctx = rig.spec("wa2", shlex.split(a.engine_args) + shlex.split(a.fallback_args), model=big)
        if ec.start_and_wait(rig, spec, ctx, None) is None:
            return None
    ec.probe_check(rig, spec)
    eng = w.engine(spec, a.util_a)
    ec.check("not_sleeping_when_ready", not w.control.is_sleeping(eng.base_url), "/is_sleeping false after start")
    return spec, ctx, eng


def run(ec: Any, rig: Any, a: Any, workers: Any) -> None:
    """The whole warm sequence (see the module docstring), then the comparison on A, woken again,
    with the time left (the warm checks first: they exist nowhere else)."""
    big = {"sleep": "level1", "gpu_memory_utilization": a.util_a}
    small = {
        "sleep": "level1",
        "gpu_memory_utilization": a.util_b,
        "source": f"local:{a.warm_model_dir}",
        "served_name": a.warm_served_name,
        "port": a.warm_port,
        "repo": "local/" + a.warm_served_name,
    }
    w = Warm(ec, rig, 0, a.hog)
    started = start_big(ec, rig, a, w, big)
    if started is None:
        return
    spec_a, ctx_a, eng_a = started
    try:
        slept = warm_part(ec, rig, a, w, eng_a, small)
        if not slept and a.fallback_engine and a.engine != a.fallback_engine:
            # It started but would not sleep (e.g. with --api-server-count): compare on it as it is,
            # then the warm part on the plain engine.
            compare_on(ec, rig, a, w, spec_a, eng_a, workers)
            workers = None
            rig.units.stop(spec_a.unit_name)
            ec.say(f"warm: {spec_a.unit_name} did not sleep; the warm part again with {a.fallback_engine!r}")
            a.engine, a.first_args = a.fallback_engine, a.fallback_args
            started = start_big(ec, rig, a, w, big)
            if started is None:
                return
            spec_a, ctx_a, eng_a = started
            warm_part(ec, rig, a, w, eng_a, small)
    finally:
        (rig.out / "warm.json").write_text(json.dumps(w.summary(), indent=1))
    compare_on(ec, rig, a, w, spec_a, eng_a, workers)
    ec.stop_and_free(rig, spec_a, ctx_a)


def compare_on(ec: Any, rig: Any, a: Any, w: Warm, spec_a: Any, eng_a: warm.EngineProcess, workers: Any) -> None:
    """The strict comparison on A, woken first if it sleeps."""
    if workers is not None:
        if w.control.is_sleeping(eng_a.base_url):
            try:
                took = warm.wake_checked(w.control, w.clock, eng_a, level=1, deadline_s=30.0)
                ec.say(f"{eng_a.name} woken for the comparison in {took:.3f} s")
            except OrchestratorError as exc:
                ec.check("wake_for_compare", False, str(exc)[:1000])
        if not w.control.is_sleeping(eng_a.base_url):
            ec.compare_check(rig, spec_a, a.levels, a.rounds, "compare", strict=True, workers=workers)


def warm_part(ec: Any, rig: Any, a: Any, w: Warm, eng_a: warm.EngineProcess, small: dict[str, Any]) -> bool:
    """False when A would not even sleep once."""
    if w.sleep(eng_a, 1, "first_sleep") is None:
        return False
    ec.say(
        f"while {eng_a.name} sleeps: /health {ec.http_status(eng_a.base_url + '/health')}, /v1/models "
        f"{ec.http_status(eng_a.base_url + '/v1/models')}"
    )
    spec_b, ctx_b = rig.spec("wb", shlex.split(a.engine_args) + shlex.split(a.warm_args), model=small)
    if ec.start_and_wait(rig, spec_b, ctx_b, None) is None:
        return True
    eng_b = w.engine(spec_b, a.util_b)
    for i in range(a.swaps):
        off, on = (eng_b, eng_a) if i % 2 == 0 else (eng_a, eng_b)
        w.swap(off, on, i + 1)
    if w.swaps and w.swaps[-1]["to"] == eng_b.name:  # end with A awake, B asleep
        w.swap(eng_b, eng_a, a.swaps + 1)
    ec.say("warm swaps: " + json.dumps(w.summary()))
    if not a.skip_level2:
        w.level2(eng_a)
    if w.sleep(eng_a, 1, "sleep_before_wedge") is not None and w.control.is_sleeping(eng_b.base_url):
        w.wedge(eng_a, eng_b)
    w.stop_freed(spec_b, eng_b, "wedged_engine_freed_by_stop")
    return True
