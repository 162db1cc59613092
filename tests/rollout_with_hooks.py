"""Test-only entry point: the CLI with a hook that holds a rollout's controller after batch N.

    python -m tests.rollout_with_hooks --pause-dir DIR rollout MODEL --config ...

While <DIR>/rollout-pause-after holds N, the controller writes <DIR>/rollout-paused after batch N
and waits until the first file goes away. It lives here, outside the package: the product has no
switch (flag or environment variable) that turns test hooks on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from orchestrator.cli import main, rollout_cmds


def pause_after(directory: Path) -> rollout_cmds.AfterBatch:
    hold, paused = directory / "rollout-pause-after", directory / "rollout-paused"

    def hook(batch: int) -> None:
        try:
            if hold.read_text().strip() != str(batch):
                return
        except FileNotFoundError:
            return
        paused.write_text(f"{batch}\n")
        while hold.exists():
            time.sleep(0.05)

    return hook


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--pause-dir":
        sys.exit("usage: python -m tests.rollout_with_hooks --pause-dir DIR ARGS...")
    rollout_cmds.after_batch_hook = pause_after(Path(sys.argv[2]))
    main(sys.argv[3:], prog_name="orchestrator")
