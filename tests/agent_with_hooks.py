"""Test-only entry point: the agent with a pause hook in its engine (the crash-matrix tests).

    python -m tests.agent_with_hooks --config deploy.toml --pause-dir /run/orchestrator-hooks

The hook holds the engine before the phase named in <dir>/pause-at until that file goes away,
writing <dir>/paused meanwhile; <dir>/pause-on ("EVENT [NODE [UNIT]]", e.g. "node_started h2")
holds it likewise right after the engine reports that event, in the middle of a step. It lives here,
outside the package: the product has no switch (flag or environment variable) that turns test hooks on.
``--time-calls FILE`` appends one JSON line per port call (start, end, thread, ``port.method``) and per
progress event: the benchmarks' profile of the agent's own critical path (bench/on_demand.py --calls).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import logs, settings
from orchestrator.adapters.clock import SystemClock
from orchestrator.agent.daemon import Agent
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment
from orchestrator.deploy.deployer import Deployer
from orchestrator.deploy.operations import Operations
from orchestrator.errors import OrchestratorError
from orchestrator.ports import HostPorts, ProgressCallback
from orchestrator.wiring import ports_factory
from tests.builders.timed import Timed


def pause_hook(directory: str) -> Callable[[Deployment], None]:
    pause_at, paused = Path(directory) / "pause-at", Path(directory) / "paused"

    def hook(dep: Deployment) -> None:
        try:
            wanted = pause_at.read_text().strip()
        except FileNotFoundError:
            return
        if wanted != dep.phase.value:
            return
        paused.write_text(f"{dep.id} {dep.phase.value}\n")
        while pause_at.exists():
            time.sleep(0.05)

    return hook


def event_hook(directory: str, progress: ProgressCallback | None) -> ProgressCallback:
    pause_on, paused = Path(directory) / "pause-on", Path(directory) / "paused"

    def hook(event: str, fields: dict[str, Any]) -> None:
        if progress is not None:
            progress(event, fields)
        try:
            wanted = pause_on.read_text().split()
        except FileNotFoundError:
            return
        if [event, str(fields.get("node")), str(fields.get("unit"))][: len(wanted)] != wanted:
            return
        paused.write_text(f"{event} {fields.get('node')} {fields.get('unit')}\n")
        while pause_on.exists():
            time.sleep(0.05)

    return hook


class CallLog:
    """Appends a JSON line per timed call or event to ``path`` (thread-safe: one write per line)."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the agent's life
        self._lock = threading.Lock()

    def write(self, **line: Any) -> None:
        line["thread"] = threading.current_thread().name
        with self._lock:
            self._file.write(json.dumps(line, default=str) + "\n")


def timed_ports(factory: Callable[[str], HostPorts], log: CallLog) -> Callable[[str], HostPorts]:
    """``factory`` whose adapters log each call (made once per host, as the product's cache)."""
    cache: dict[str, HostPorts] = {}

    def ports_for(name: str) -> HostPorts:
        if name not in cache:
            p = factory(name)

            def record(t0: float, t1: float, call: str) -> None:
                log.write(t0=t0, t1=t1, call=call)

            wrapped = {
                f: Timed(getattr(p, f), f, record, clock=time.time)
                for f in ("shell", "systemd", "gpus", "health", "weights", "proxy")
                if getattr(p, f) is not None
            }
            controls = {k: Timed(v, f"engine.{k}", record, clock=time.time) for k, v in p.engine_controls.items()}
            cache[name] = dataclasses.replace(p, **wrapped, engine_controls=controls)
        return cache[name]

    return ports_for


class HookedOperations(Operations):
    def __init__(self, catalog: Catalog, pause_dir: str, calls: CallLog | None = None) -> None:
        factory = ports_factory(catalog)
        super().__init__(
            catalog, factory if calls is None else timed_ports(factory, calls), before_step=pause_hook(pause_dir)
        )
        self.pause_dir = pause_dir
        self.calls = calls

    def deployer(self, progress: ProgressCallback | None = None) -> Deployer:
        hooked = event_hook(self.pause_dir, progress)
        calls = self.calls
        if calls is None:
            return super().deployer(hooked)

        def logged(event: str, fields: dict[str, Any]) -> None:
            calls.write(t0=time.time(), event=event, fields=fields)
            hooked(event, fields)

        return super().deployer(logged)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.agent_with_hooks")
    parser.add_argument("--config", required=True)
    parser.add_argument("--pause-dir", required=True)
    parser.add_argument(
        "--minute-ends-in",
        type=float,
        default=None,
        metavar="S",
        help="the agent's clock runs ahead so that its first minute ends S seconds after it "
        "starts: an every-minute schedule fires then, not up to 60 s later",
    )
    parser.add_argument("--time-calls", metavar="FILE", help="log every port call and event with its time")
    args = parser.parse_args()
    logs.configure(json=True)
    cat = settings.load(args.config)
    calls = CallLog(args.time_calls) if args.time_calls else None

    def ops_for(catalog: Catalog) -> Operations:
        return HookedOperations(catalog, args.pause_dir, calls)

    clock = None if args.minute_ends_in is None else AheadClock.minute_ending_in(args.minute_ends_in)
    Agent(
        cat,
        ops_for(cat),
        metrics_port=cat.metrics_port or None,
        clock=clock,
        config_path=str(Path(args.config).resolve()),
        ops_factory=ops_for,
    ).run()


class AheadClock(SystemClock):
    """The system's clocks with the wall clock ``ahead`` seconds in the future (monotonic as is)."""

    def __init__(self, ahead: float) -> None:
        self.ahead = ahead

    @classmethod
    def minute_ending_in(cls, seconds: float) -> AheadClock:
        return cls((60.0 - seconds - time.time() % 60.0) % 60.0)

    def now(self) -> float:
        return time.time() + self.ahead


if __name__ == "__main__":
    try:
        main()
    except OrchestratorError as exc:  # as the product's CLI: one line and its exit code (2: the unit stays failed)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
