"""Weights used in place (`source = "local:/dir"`) on a real test host: a missing or damaged shard
refuses the switch while the old model still serves (the CLI exits 1 naming the file); a whole
model switches. The stage worker runs inside the host over SSH, as in production."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core.weights import MANIFEST_NAME
from tests.hosts.machine import Host
from tests.hubstub.models import sharded_model
from tests.test_switch_hosts import MODELS, config_text, unit_states

pytestmark = pytest.mark.hosts

WEIGHTS = "/srv/weights-check/tiny"  # inside the host (not /tmp: units run with PrivateTmp=yes)
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "float32",
}
LOCAL = {"port": 8130, "source": f"local:{WEIGHTS}", "args": ["--load-time", "0.3"]}


def write_model(host: Host) -> Path:
    """The model's files, written into the host's root (an overlay this machine sees too)."""
    root = host.root / WEIGHTS.lstrip("/")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for name, data in sharded_model(SHARDS, 4096).items():
        (root / name).write_bytes(data)
    (root / "config.json").write_text(json.dumps(CONFIG))  # what preflight needs to plan TP=4
    return root


def add_manifest(root: Path) -> None:
    """What a staged revision carries: each file's size and sha256 (used in place it is checked)."""
    files = {p.name: p.stat().st_size for p in root.iterdir()}
    sha = {n: hashlib.sha256((root / n).read_bytes()).hexdigest() for n in files}
    (root / MANIFEST_NAME).write_text(
        json.dumps(
            {
                "name": "org--tiny",
                "repo": "org/tiny",
                "revision": "c" * 40,
                "files": files,
                "source": "hub",
                "staged_at": time.time(),
                "path": WEIGHTS,
                "sha256": sha,
            }
        )
    )


def flip_data_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8 + struct.unpack("<Q", bytes(data[:8]))[0] + 10] ^= 0x01
    path.write_bytes(bytes(data))


def missing_shard(root: Path) -> None:
    (root / SHARDS[1]).unlink()


def corrupt_header(root: Path) -> None:
    shard = root / SHARDS[1]
    shard.write_bytes(b"\xff" * 8 + shard.read_bytes()[8:])


def flipped_byte_with_manifest(root: Path) -> None:
    add_manifest(root)
    flip_data_byte(root / SHARDS[1])


DAMAGE: dict[str, Callable[[Path], None]] = {
    "missing shard": missing_shard,
    "corrupt header": corrupt_header,
    "flipped byte, sha256 known": flipped_byte_with_manifest,
}


@pytest.fixture
def cfg(host: Host, tmp_path: Path) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(config_text(host, tmp_path / "state", {"alpha": MODELS["alpha"], "tiny": LOCAL}))
    assert switch(path, "alpha").returncode == 0
    return path


def switch(cfg: Path, model: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "switch", model, "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def invocation(host: Host, unit: str) -> str:
    return str(host.run(["systemctl", "show", "-p", "InvocationID", "--value", unit]).stdout.strip())


def serves(host: Host, port: int) -> bool:
    with urllib.request.urlopen(f"http://{host.address}:{port}/health", timeout=10) as r:
        return bool(r.status == 200)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_local_model_is_refused_before_the_serving_model_stops(host: Host, cfg: Path, damage: str) -> None:
    """Missing shard, corrupt header, flipped byte (sha256 known): exit 1 naming the shard; alpha serves on."""
    DAMAGE[damage](write_model(host))
    before = invocation(host, "vllm-alpha.service")
    result = switch(cfg, "tiny")
    assert result.returncode == 1, result.stdout + result.stderr
    assert ": aborted" in result.stdout
    assert SHARDS[1] in result.stderr and WEIGHTS in result.stderr
    assert unit_states(host, "alpha", "tiny") == {"alpha": "active", "tiny": "inactive"}
    assert invocation(host, "vllm-alpha.service") == before  # never stopped, not restarted
    assert serves(host, MODELS["alpha"]["port"])


def test_a_whole_local_model_switches_in_place(host: Host, cfg: Path) -> None:
    """The same directory undamaged (with its manifest) passes the checks and serves."""
    add_manifest(write_model(host))
    result = switch(cfg, "tiny")
    assert result.returncode == 0, result.stdout + result.stderr
    assert unit_states(host, "alpha", "tiny") == {"alpha": "inactive", "tiny": "active"}
