"""The smallest deploy.toml with one SSH box and one model (nothing is reached until a command acts)."""

from __future__ import annotations

ONE_BOX_TOML = """state_dir = "{state}"
[defaults]
engine = ["/opt/vllm/bin/vllm", "serve"]
[hosts.box]
transport = "ssh"
address = "127.0.0.9"
gpus = 8
gpu_memory_gib = 96
[models.alpha]
repo = "org/alpha"
gpus = [0, 1, 2, 3]
tensor_parallel = 4
port = 8000
{extra}"""
