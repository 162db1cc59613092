#!/usr/bin/env python3
"""The README's warm-switch walk-through, for real: one systemd test host, stand-in engines with
vLLM's sleep API, the real HAProxy; `orchestrator switch` alpha, beta, alpha, then the `status` and
`history` a person would read, as the CLI prints them (committed as bench/warm_walkthrough.txt).

    .venv/bin/python bench/warm_walkthrough.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from click.testing import CliRunner

from orchestrator.cli import main
from tests.builders.proxy import proxy_box

ENGINE = ["--load-time", "2", "--wake-time", "0.3", "--sleep-time", "0.1"]
WARM = {
    "served_name": "chat",
    "gpus": [0, 1, 2, 3],
    "tensor_parallel": 4,
    "sleep": "level1",
    "wake_deadline_s": 10,
    "args": ENGINE,
}


def run(cfg: Path, *args: str) -> None:
    cmd = [args[0], "--config", str(cfg), *args[1:]]
    print(f"$ orchestrator {' '.join(a for a in args)}")
    out = CliRunner().invoke(main, cmd, catch_exceptions=False, env={"COLUMNS": "160"})
    print(out.output.rstrip(), flush=True)


def main_() -> None:
    with proxy_box(
        {"alpha": {"port": 8151, **WARM}, "beta": {"port": 8152, **WARM}}, host_keys="sleep_ram_gib = 8\n"
    ) as (_, cfg):
        for model in ("alpha", "beta", "alpha"):
            run(cfg, "switch", model)
        run(cfg, "status", "--local")
        run(cfg, "history", "--local")


if __name__ == "__main__":
    main_()
