"""Files written through a temporary name never follow a symlink planted at a guessable name: the
temporary is created exclusively under a random name, then renamed over the target."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import userfiles
from orchestrator.adapters.local_shell import LocalShell
from orchestrator.worker.files import write_atomic as worker_write_atomic

REPO = Path(__file__).resolve().parents[2]
DEPLOY = '[hosts.box]\ngpus = 8\n[models.m]\nrepo = "org/m"\ngpus = [0]\n'


def plant(directory: Path, names: list[str], victim: Path) -> None:
    """Symlinks to ``victim`` at every name a careless writer might use for its temporary."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).symlink_to(victim)


def guesses(target: str) -> list[str]:
    stem = target.rsplit(".", 1)[0]
    return [f"{stem}.tmp", f"{target}.tmp", f".{target}.tmp", f"{target}.new", f".{target}", f"{target}~"]


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def test_render_out_does_not_follow_a_planted_temporary(tmp_path: Path, victim: Path) -> None:
    """`render --out` writes the unit and leaves a file that symlinks at its temporary names point to alone."""
    (tmp_path / "deploy.toml").write_text(DEPLOY)
    out = tmp_path / "units"
    plant(out, guesses("vllm-m.service"), victim)
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "render", "--config", str(tmp_path / "deploy.toml"), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert "ExecStart=" in (out / "vllm-m.service").read_text()
    assert not (out / "vllm-m.service").is_symlink()


@pytest.mark.parametrize("writer", ["helper", "local shell", "worker"])
def test_atomic_writers_ignore_planted_temporaries_and_replace_a_symlinked_target(
    writer: str, tmp_path: Path, victim: Path
) -> None:
    """Each writer through a temporary replaces the target (a symlink there too) without touching the victim."""
    target = tmp_path / "d" / "unit.service"
    plant(target.parent, [*guesses(target.name), target.name], victim)
    if writer == "helper":
        userfiles.write_atomic(target, b"new\n", mode=0o640)
    elif writer == "local shell":
        LocalShell().write_file(str(target), b"new\n", mode=0o640)
    else:
        worker_write_atomic(target, b"new\n")
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_bytes() == b"new\n"
    leftovers = {p.name for p in target.parent.iterdir()} - set(guesses(target.name)) - {target.name}
    assert leftovers == set()


def test_a_failed_write_leaves_no_temporary(tmp_path: Path) -> None:
    """When the rename cannot happen (the target is a directory), no temporary file is left."""
    (tmp_path / "unit.service").mkdir()
    with pytest.raises(OSError):
        userfiles.write_atomic(tmp_path / "unit.service", b"x")
    assert sorted(os.listdir(tmp_path)) == ["unit.service"]
