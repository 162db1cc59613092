"""deploy.toml ``source``: hub, none, local:/dir or host:NAME (a peer copy), checked against the hosts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"
BASE = f"""
[hosts.gpu1]
gpus = 8
[hosts.gpu2]
gpus = 8
address = "10.0.0.2"
[models.a]
host = "gpu1"
repo = "org/a"
revision = "{SHA}"
gpus = [0]
"""


def models(cfg: Path) -> subprocess.CompletedProcess[str]:
    return run("models", "--config", str(cfg), "--json", cwd=REPO)


@pytest.mark.parametrize(
    ("source", "revision", "message"),
    [
        ("host:gpu9", SHA, "models.a.source: source 'host:gpu9' names unknown host 'gpu9' (known: gpu1, gpu2)"),
        ("host:gpu1", SHA, "models.a.source: source 'host:gpu1' is the model's own host 'gpu1'"),
        ("host:gpu2", "main", "models.a.source: source 'host:gpu2' needs revision pinned to a commit SHA"),
        ("host:", SHA, "models.a.source: source 'host:' is not"),
        ("ftp://x", SHA, "models.a.source: source 'ftp://x' is not"),
        ("local:relative/dir", SHA, "models.a.source: source 'local:relative/dir' is not"),
        (
            "local:/srv/../etc",
            SHA,
            "models.a.source: source 'local:/srv/../etc': the local weights directory has a '.'",
        ),
    ],
)
def test_bad_source_exits_2_naming_key_and_value(tmp_path: Path, source: str, revision: str, message: str) -> None:
    """An unknown, own or unpinned peer, or a malformed source, exits 2 with the key and the value."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(BASE.replace(SHA, revision) + f'source = "{source}"\n')
    result = models(cfg)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
