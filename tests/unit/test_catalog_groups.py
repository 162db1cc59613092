"""deploy.toml ``[groups.NAME]``: hosts that run one replica each of a group model, and its rollout policy."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .cli_runner import run

REPO = Path(__file__).resolve().parents[2]
HOSTS = "".join(f'[hosts.gpu{i}]\naddress = "10.0.0.{i}"\ngpus = 8\n' for i in (1, 2, 3))
MODEL = '[models.m]\ngroup = "inference"\nrepo = "org/m"\ngpus = [0, 1]\ntensor_parallel = 2\n'


def models(cfg: Path) -> subprocess.CompletedProcess[str]:
    return run("models", "--config", str(cfg), "--json", cwd=REPO)


def test_group_model_is_listed_with_its_group(tmp_path: Path) -> None:
    """A valid group and a model targeting it: `models` shows host group:inference."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(HOSTS + '[groups.inference]\nhosts = ["gpu1", "gpu2", "gpu3"]\ncanary = 1\nbatch = 2\n' + MODEL)
    result = models(cfg)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["host"] == "group:inference"


@pytest.mark.parametrize(
    ("group", "model", "message"),
    [
        ('hosts = ["gpu1", "gpu9"]', MODEL, "groups.inference.hosts: unknown host 'gpu9' (known: gpu1, gpu2, gpu3)"),
        ('hosts = ["gpu1", "gpu2", "gpu1"]', MODEL, "groups.inference.hosts: host 'gpu1' is listed more than once"),
        ("hosts = []", MODEL, "groups.inference.hosts: a group needs at least one host"),
        ('hosts = ["gpu1"]\nseed = "gpu2"', MODEL, "groups.inference.seed: seed 'gpu2' is not a host of the group"),
        ('hosts = ["gpu1"]\nbatch = 0', MODEL, "groups.inference.batch: Input should be greater than or equal to 1"),
        ('hosts = ["gpu1"]\ngate = "vibes"', MODEL, "groups.inference.gate: Input should be 'none', 'health' or"),
        ('hosts = ["gpu1"]\npeer_key = "key"', MODEL, "groups.inference.peer_key: 'key' is not an absolute path"),
        (
            'hosts = ["gpu1"]',
            MODEL.replace('"inference"', '"training"'),
            "models.m.group: unknown group 'training' (known: inference)",
        ),
        (
            'hosts = ["gpu1"]',
            MODEL.replace("[models.m]\n", '[models.m]\nhost = "gpu1"\n'),
            "models.m: set host ('gpu1') or group ('inference'), not both",
        ),
        (
            'hosts = ["gpu1"]',
            MODEL.replace("gpus = [0, 1]", "gpus = [7, 8]"),
            "models.m.gpus: GPU index 8 is out of range: host gpu1 has 8 GPUs",
        ),
        (
            'hosts = ["gpu1"]',
            MODEL + 'source = "host:gpu2"\nrevision = "' + "a" * 40 + '"\n',
            "models.m.source: source 'host:gpu2': a group model's weights come from the hub once per rollout",
        ),
    ],
)
def test_bad_group_exits_2_naming_key_and_value(tmp_path: Path, group: str, model: str, message: str) -> None:
    """Unknown host, a host twice, an empty group, a foreign seed, bad policy, unknown group: exit 2, one message."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(HOSTS + f"[groups.inference]\n{group}\n" + model)
    result = models(cfg)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
