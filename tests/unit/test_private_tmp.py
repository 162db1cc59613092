"""Paths a vLLM unit must see cannot live under /tmp or /var/tmp: units run with PrivateTmp=yes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.errors import ConfigError

BASE = """
[defaults]
engine = {engine}
[hosts.box]
gpus = 8
models_dir = "{models_dir}"
{host_engine}
[models.a]
repo = "org/a"
revision = "0123456789abcdef0123456789abcdef01234567"
source = "{source}"
gpus = [0]
"""
GOOD = {"engine": '["/opt/vllm/bin/vllm", "serve"]', "models_dir": "/models", "host_engine": "", "source": "hub"}


def write(tmp_path: Path, **fields: str) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(BASE.format(**{**GOOD, **fields}))
    return path


@pytest.mark.parametrize(
    "fields,key,bad",
    [
        ({"engine": '["/tmp/clone/.venv/bin/python", "-m", "vllm"]'}, "defaults.engine", "/tmp/clone/.venv/bin/python"),
        ({"host_engine": 'engine = ["/usr/bin/python3", "/var/tmp/shim.py"]'}, "hosts.box.engine", "/var/tmp/shim.py"),
        # "/tmp/../tmp/...": a ".." part, refused first
        ({"models_dir": "/tmp/models"}, "hosts.box.models_dir", "/tmp/models"),
        ({"source": "local:/var/tmp/weights"}, "models.a.source", "/var/tmp/weights"),
    ],
)
def test_paths_under_private_tmp_are_refused(tmp_path: Path, fields: dict[str, str], key: str, bad: str) -> None:
    """An engine, models_dir or local weights under /tmp or /var/tmp is one error naming key, path and why."""
    with pytest.raises(ConfigError) as err:
        settings.load(write(tmp_path, **fields))
    assert f"{key}: " in str(err.value) and f"{bad} is under" in str(err.value) and "PrivateTmp=yes" in str(err.value)


def test_paths_outside_tmp_load(tmp_path: Path) -> None:
    """/opt, /models and a directory merely named tmp elsewhere are fine."""
    cat = settings.load(write(tmp_path, models_dir="/srv/tmp/models", source="local:/data/tmpfiles"))
    assert cat.hosts["box"].models_dir == "/srv/tmp/models"


def test_engine_under_tmp_exits_2_in_one_line(tmp_path: Path) -> None:
    """The CLI reports it as bad configuration: exit 2, one line, no traceback."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "models",
            "--config",
            str(write(tmp_path, engine='["/tmp/venv/bin/vllm", "serve"]')),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
