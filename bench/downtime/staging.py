"""Models whose weights are not on the host yet: generated repos served by the local hub stand-in.

Shards are a repeated random block (generating GBs of fresh randomness would dominate the run);
each shard is a valid safetensors file and the repo has the index the stage worker verifies against.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct

from tests.hubstub import HubStub, StubFile, StubRepo

SHARD_BYTES = 512 << 20
# A small Llama: the planner checks the layout against it before anything is stopped.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
BLOCK = os.urandom(1 << 20)


class CachedFile(StubFile):
    """The stub hashes a file on every listing; for GB files hash once."""

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data or b"").hexdigest()


def _shard(tensor: str, nbytes: int) -> bytes:
    floats = nbytes // 4
    header = json.dumps(
        {
            "__metadata__": {"format": "pt"},
            tensor: {"dtype": "F32", "shape": [floats], "data_offsets": [0, floats * 4]},
        },
        separators=(",", ":"),
    ).encode()
    header += b" " * (-len(header) % 8)
    body = (BLOCK * (floats * 4 // len(BLOCK) + 1))[: floats * 4]
    return struct.pack("<Q", len(header)) + header + body


@functools.cache
def repo_files(total_bytes: int) -> dict[str, CachedFile]:
    """config, index and shards adding up to about ``total_bytes`` (shared by repos of one size)."""
    n = max(1, round(total_bytes / SHARD_BYTES))
    names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    files = {"config.json": json.dumps(CONFIG).encode()}
    weight_map = {}
    floats = total_bytes // n // 4
    for i, name in enumerate(names):
        tensor = f"model.layers.{i}.mlp.weight"
        files[name] = _shard(tensor, floats * 4)
        weight_map[tensor] = name
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": floats * 4 * n}, "weight_map": weight_map}
    ).encode()
    return {name: CachedFile(data) for name, data in files.items()}


def add_repo(hub: HubStub, repo_id: str, total_bytes: int, sha: str) -> StubRepo:
    return hub.add(StubRepo(repo_id, sha, dict(repo_files(total_bytes)), None, {"main": sha}))
