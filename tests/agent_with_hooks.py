"""Test-only entry point: the agent with a pause hook in its engine (the crash-matrix tests).

    python -m tests.agent_with_hooks --config deploy.toml --pause-dir /run/orchestrator-hooks

The hook holds the engine before the phase named in <dir>/pause-at until that file goes away,
writing <dir>/paused meanwhile. It lives here, outside the package: the product has no switch
(flag or environment variable) that turns test hooks on.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator import logs, settings
from orchestrator.agent.daemon import Agent
from orchestrator.core.catalog import Catalog
from orchestrator.core.records import Deployment
from orchestrator.deploy.operations import Operations
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


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.agent_with_hooks")
    parser.add_argument("--config", required=True)
    parser.add_argument("--pause-dir", required=True)
    args = parser.parse_args()
    logs.configure(json=True)
    cat = settings.load(args.config)
    hook = pause_hook(args.pause_dir)

    def ops_for(catalog: Catalog) -> Operations:
        return Operations(catalog, ports_factory(catalog), before_step=hook)

    Agent(cat, ops_for(cat), metrics_port=cat.metrics_port or None,
          config_path=str(Path(args.config).resolve()), ops_factory=ops_for).run()


if __name__ == "__main__":
    main()
