"""What the CLI prints at an 80-column terminal and through a pipe: every name and value whole."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MINIMAX = REPO / "tests/fixtures/configs/MiniMaxAI__MiniMax-M2.5.json"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SHIPPED = [
    "kimi-k25-nvfp4",
    "minimax-m25",
    "minimax-m25-ep",
    "kimi-k25-int4",
    "blackwell",
    "nvidia/Kimi-K2.5-NVFP4@main (unpinned)",
    "MiniMaxAI/MiniMax-M2.5@main (unpinned)",
    "moonshotai/Kimi-K2.5@main (unpinned)",
    "0,1,2,3,4,5,6,7",
    "TP=8 + EP",
    "minimax-m2.5",
]


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "80", "LINES": "24", "TERM": "xterm-256color"}


def run_piped(*args: str) -> str:
    """stdout of the CLI through a pipe, at COLUMNS=80."""
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True, cwd=REPO, env=_env(), check=False
    )
    assert r.returncode in (0, 3), r.stderr
    return r.stdout


def run_on_tty(*args: str) -> str:
    """What the CLI shows on an 80-column terminal (a pseudo-terminal), escape codes removed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", *args],
        stdout=slave,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=_env(),
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.wait(timeout=60)
    return ANSI.sub("", b"".join(chunks).decode().replace("\r\n", "\n"))


@pytest.mark.parametrize("run", [run_piped, run_on_tty], ids=["pipe", "tty80"])
def test_models_shows_every_name_whole(run: Callable[..., str]) -> None:
    """`models` never cuts a model name, host, repo@revision, GPU list or layout."""
    out = run("models", "--config", str(REPO / "deploy.toml"))
    missing = [value for value in SHIPPED if value not in out]
    assert missing == [] and "…" not in out, out


@pytest.mark.parametrize("run", [run_piped, run_on_tty], ids=["pipe", "tty80"])
def test_plan_shows_layouts_whole_and_explains_below(run: Callable[..., str]) -> None:
    """`plan` lists each layout whole in the table and its explanation as a numbered note below."""
    args = ("plan", "minimax-m25-ep", "--config", str(REPO / "deploy.toml"), "--model-config", str(MINIMAX))
    layouts = json.loads(run_piped(*args, "--json"))["layouts"][:6]
    out = run(*args)
    flat = " ".join(out.split())  # a terminal wraps notes at word boundaries
    for number, lay in enumerate(layouts, 1):
        assert re.search(rf"\b{number}\b.*{re.escape(lay['layout']['name'])}", out), out
        assert f"{number}. {lay['why']}" in flat, out
    assert "…" not in out


def test_plan_notes_are_whole_lines_through_a_pipe() -> None:
    """Through a pipe every explanation is one line, so grep finds it."""
    args = ("plan", "minimax-m25-ep", "--config", str(REPO / "deploy.toml"), "--model-config", str(MINIMAX))
    layouts = json.loads(run_piped(*args, "--json"))["layouts"][:6]
    lines = run_piped(*args).splitlines()
    assert all(any(line.endswith(lay["why"]) for line in lines) for lay in layouts)


def test_history_without_deployments_says_so(tmp_path: Path) -> None:
    """`history` on a fresh state directory says in words that nothing was recorded on the host."""
    out = run_piped("history", "--local", "--config", str(_fresh_state(tmp_path)))
    assert out.strip() == "no deployments recorded yet on host blackwell"


def _fresh_state(tmp_path: Path) -> Path:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        (REPO / "deploy.toml")
        .read_text()
        .replace('state_dir = "/var/lib/orchestrator"', f'state_dir = "{tmp_path / "state"}"')
    )
    return cfg


def test_schedules_show_name_cron_and_window_whole(tmp_path: Path) -> None:
    """`schedules` through a pipe at 80 columns keeps the name, cron and window on one line."""
    out = run_piped("schedules", "--config", str(_fresh_state(tmp_path)))
    row = next(line for line in out.splitlines() if line.startswith("nightly-redeploy"))
    assert "30 3 * * *" in row and "redeploy" in row and "03:00-05:00" in row, out


def test_compare_without_benchmarks_says_so(tmp_path: Path) -> None:
    """`compare` on a host with no benchmark says so in words, not as an empty table."""
    out = run_piped("compare", "--config", str(_fresh_state(tmp_path)))
    assert out.strip() == "no benchmarks recorded yet on host blackwell"
