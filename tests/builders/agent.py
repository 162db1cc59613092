"""Where the agent host tests (and bench/fleet_rollout.py) put a box's agent: config, state, hooks."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = "/etc/orchestrator-agent-test.toml"
STATE = "/var/lib/orchestrator-agent-test"
HOOKS = "/run/orchestrator-hooks"
PY = sys.executable
