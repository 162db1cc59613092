"""Test-only entry point: the agent with a pause hook in its engine (the crash-matrix tests).

    python -m tests.agent_with_hooks --config deploy.toml --pause-dir /run/orchestrator-hooks

The hook holds the engine before the phase named in <dir>/pause-at until that file goes away,
writing <dir>/paused meanwhile; <dir>/pause-on ("EVENT [NODE [UNIT]]", e.g. "node_started h2")
holds it likewise right after the engine reports that event, in the middle of a step. It lives here,
outside the package: the product has no switch (flag or environment variable) that turns test hooks on.
"""

from __future__ import annotations

import argparse
import sys
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
from orchestrator.ports import ProgressCallback
from orchestrator.wiring import ports_factory


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


class HookedOperations(Operations):
    def __init__(self, catalog: Catalog, pause_dir: str) -> None:
        super().__init__(catalog, ports_factory(catalog), before_step=pause_hook(pause_dir))
        self.pause_dir = pause_dir

    def deployer(self, progress: ProgressCallback | None = None) -> Deployer:
        return super().deployer(event_hook(self.pause_dir, progress))


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
    args = parser.parse_args()
    logs.configure(json=True)
    cat = settings.load(args.config)

    def ops_for(catalog: Catalog) -> Operations:
        return HookedOperations(catalog, args.pause_dir)

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
