"""Generated model repos: real safetensors files (header + random data), config and index."""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Mapping


def safetensors_bytes(tensors: Mapping[str, tuple[int, ...]], *, seed: int = 0) -> bytes:
    """A valid safetensors file of F32 tensors with random contents."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        n = 4
        for dim in shape:
            n *= dim
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + random.Random(seed).randbytes(offset)


def sharded_model(shard_names: list[str], floats_per_shard: int) -> dict[str, bytes]:
    """config.json, model.safetensors.index.json naming exactly ``shard_names``, and the shards."""
    files: dict[str, bytes] = {
        "config.json": json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
            }
        ).encode(),
        "tokenizer_config.json": b"{}",
    }
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shard_names):
        names = {f"model.layers.{i}.mlp.weight": (floats_per_shard,)}
        files[shard] = safetensors_bytes(names, seed=i)
        weight_map.update({n: shard for n in names})
        total += floats_per_shard * 4
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1
    ).encode()
    return files


def single_file_model(floats: int) -> dict[str, bytes]:
    """A model with one model.safetensors and no index."""
    return {
        "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
        "model.safetensors": safetensors_bytes({"lm_head.weight": (floats,)}),
    }
