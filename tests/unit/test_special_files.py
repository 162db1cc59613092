"""Every file read on user input is read bounded and without blocking: a FIFO, /dev/zero, a directory
or a huge file is refused by name (exit 2, or 4 for SSH's files), never a hang or a MemoryError."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import userfiles

REPO = Path(__file__).resolve().parents[2]
# A guard only: the commands answer at once; a hang would otherwise block the suite forever.
GUARD_S = 60
DEPLOY = '[hosts.box]\ntransport = "local"\ngpus = 8\n[models.m]\nrepo = "org/m"\ngpus = [0]\n'


def special(kind: str, tmp_path: Path) -> str:
    """A path of the given kind: a FIFO nobody writes, /dev/zero, a directory, a sparse 17 MiB file."""
    if kind == "fifo":
        path = tmp_path / "pipe"
        os.mkfifo(path)
        return str(path)
    if kind == "zero":
        return "/dev/zero"
    if kind == "dir":
        (tmp_path / "adir").mkdir()
        return str(tmp_path / "adir")
    big = tmp_path / "big"
    with big.open("wb") as fh:
        fh.truncate(userfiles.MAX_BYTES + 1)
    return str(big)


KIND_WORDS = {"fifo": "FIFO", "zero": "character device", "dir": "directory", "big": "bytes, more than"}


def run(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=GUARD_S,
        check=False,
    )


@pytest.mark.parametrize("kind", list(KIND_WORDS))
def test_helper_refuses_what_is_not_a_regular_file_or_too_big(kind: str, tmp_path: Path) -> None:
    """read_bytes names what the path is and reads nothing from it."""
    with pytest.raises(OSError, match=KIND_WORDS[kind]):
        userfiles.read_bytes(special(kind, tmp_path))


def test_helper_reads_a_regular_file(tmp_path: Path) -> None:
    """A regular file under the cap is read whole."""
    (tmp_path / "f").write_bytes(b"x" * 70_000)
    assert userfiles.read_bytes(tmp_path / "f") == b"x" * 70_000


def _deploy(tmp_path: Path, extra: str = "") -> str:
    (tmp_path / "deploy.toml").write_text(DEPLOY + extra)
    return str(tmp_path / "deploy.toml")


def _hosts_file(tmp_path: Path, known: str) -> dict[str, str]:
    (tmp_path / "hosts.toml").write_text(f'[box]\nurl = "ssh://root@127.0.0.1:1"\nknown_hosts = "{known}"\n')
    return {"ORCHESTRATOR_HOSTS_FILE": str(tmp_path / "hosts.toml")}


# (entry point, how to call it with the special path, the exit code expected)
CASES: dict[str, tuple[Callable[[str, Path], subprocess.CompletedProcess[str]], int]] = {
    "deploy.toml": (lambda p, t: run("models", "--config", p), 2),
    "model config": (lambda p, t: run("models", "--config", _deploy(t, f'config = "{p}"\n')), 2),
    "plan --config": (lambda p, t: run("plan", "--config", p, "--gpus", "8", "--gpu-memory-gib", "80"), 2),
    "plan --model-config": (lambda p, t: run("plan", "m", "--config", _deploy(t), "--model-config", p), 2),
    "tune --model-config": (lambda p, t: run("tune", "m", "--config", _deploy(t), "--model-config", p), 2),
    "render --template": (
        lambda p, t: run("render", "--config", _deploy(t), "--out", str(t / "out"), "--template", p),
        2,
    ),
    "config diff": (lambda p, t: run("config", "diff", p), 2),
    "agent install --config": (lambda p, t: run("agent", "install", "ssh://root@127.0.0.1:1", "--config", p), 2),
    "hosts.toml": (lambda p, t: run("--host", "box", "status", env={"ORCHESTRATOR_HOSTS_FILE": p}), 2),
    "known_hosts": (lambda p, t: run("--host", "box", "status", env=_hosts_file(t, p)), 4),
}


@pytest.mark.parametrize("kind", ["fifo", "zero"])
@pytest.mark.parametrize("entry", list(CASES))
def test_every_user_file_is_refused_when_special(entry: str, kind: str, tmp_path: Path) -> None:
    """Each entry point exits with its bad-input code naming the path and what it is, at once."""
    path = special(kind, tmp_path)
    call, code = CASES[entry]
    done = call(path, tmp_path)
    assert done.returncode == code, done.stderr
    assert path in done.stderr and KIND_WORDS[kind] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_relay_config_that_is_special_does_not_hang_the_relay(kind: str, tmp_path: Path) -> None:
    """The relay falls back to the default socket and reports the agent unreachable (exit 6)."""
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator.agent.relay", "--config", special(kind, tmp_path)],
        capture_output=True,
        text=True,
        timeout=GUARD_S,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "ORCHESTRATOR_SOCKET": ""},
    )
    assert done.returncode == 6 and "agent socket" in done.stderr
