"""Test-only entry point: the agent with a hook that holds its fleet controller after batch N.

    python -m tests.controller_with_hooks --pause-dir DIR agent --config ...

The same files as tests/rollout_with_hooks.py: while <DIR>/rollout-pause-after holds N, the
controller writes <DIR>/rollout-paused after batch N and waits until the first file goes away.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.agent import controller
from orchestrator.cli import main
from tests.rollout_with_hooks import pause_after

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--pause-dir":
        sys.exit("usage: python -m tests.controller_with_hooks --pause-dir DIR ARGS...")
    controller.after_batch_hook = pause_after(Path(sys.argv[2]))
    main(sys.argv[3:], prog_name="orchestrator")
