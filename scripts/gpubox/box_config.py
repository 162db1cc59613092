#!/usr/bin/env python3
"""The GPU box's deploy.toml, printed: two real models on the same GPU (a warm pair behind one served name).

big: m8 (13 GiB bf16) at 0.6 of the GPU; small: m1 (1.4 GiB) at 0.3 (fits awake beside big); mid: m1 at 0.5
(does not); od: m1 at 0.2 on demand under the name "od"; all `sleep = "level1"`, staged from `local:` folders
(so the worker runs), behind the front proxy on 127.0.0.1:8000; big, small and mid serve the name "chat".
With DRY=1 the engine is the project's stand-in (tests/standin/openai_server.py) and the models
scripts/setup.sh's tiny ones.
Environment: GPUS, MODELS_DIR, REPO, DRY, PYKEY (1: write hosts.box.python, the work-around for a box whose
worker interpreter is not the agent's).
"""

from __future__ import annotations

import json
import os

dry = os.environ.get("DRY") == "1"
gpus = int(os.environ.get("GPUS", "1"))
models_dir = os.environ.get("MODELS_DIR", "/srv/models")
repo = os.environ.get("REPO", "/work/main")

if dry:
    engine = ["/usr/bin/python3", f"{repo}/tests/standin/vllm_compat.py"]  # stdlib only; the venv is under /root
    engine_args = ["--load-time", "3", "--wake-time", "0.3", "--sleep-time", "0.1", "--engine-child"]
    env: dict[str, str] = {}
    models_dir = "/var/lib/orchestrator-test/models"  # scripts/setup.sh's tiny models, as m8 and m1
else:
    engine = ["/opt/torch/.venv/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
    engine_args = []
    env = {
        "PYTHONPATH": "/opt/vllm/site",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    if gpus > 1:  # NVLink multicast stays off on the lent multi-GPU machines
        env.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")


def toml(value: object) -> str:
    """A TOML value for a str, number, bool, list or flat dict."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


all_gpus = list(range(gpus))
models = {
    "big": {
        "repo": "local/m8",
        "source": f"local:{models_dir}/{'tiny-a' if dry else 'm8'}",
        "served_name": "chat",
        "port": 8101,
        "gpus": all_gpus,
        "tensor_parallel": gpus,
        "gpu_memory_utilization": 0.6,
        "max_model_len": 4096,
        "sleep": "level1",
        "load_deadline_s": 600,
        "wake_deadline_s": 60,
        "args": engine_args,
        "env": {**env, **({"STANDIN_GPU_MIB": "86000"} if dry else {})},
    },
    "small": {
        "repo": "local/m1",
        "source": f"local:{models_dir}/{'tiny-b' if dry else 'm1'}",
        "served_name": "chat",
        "port": 8102,
        "gpus": all_gpus,
        "tensor_parallel": gpus,
        "gpu_memory_utilization": 0.3,
        "max_model_len": 4096,
        "sleep": "level1",
        "load_deadline_s": 600,
        "wake_deadline_s": 60,
        "args": engine_args,
        "env": {**env, **({"STANDIN_GPU_MIB": "43000"} if dry else {})},
    },
    # mid: m1 at 0.5: does not fit awake beside big (0.6), so big <-> mid is the sleep-then-wake warm switch
    "mid": {
        "repo": "local/m1",
        "source": f"local:{models_dir}/{'tiny-b' if dry else 'm1'}",
        "served_name": "chat",
        "port": 8103,
        "gpus": all_gpus,
        "tensor_parallel": gpus,
        "gpu_memory_utilization": 0.5,
        "max_model_len": 4096,
        "sleep": "level1",
        "load_deadline_s": 600,
        "wake_deadline_s": 60,
        "args": engine_args,
        "env": {**env, **({"STANDIN_GPU_MIB": "71000"} if dry else {})},
    },
    # od: on demand under its own name; a request for it starts or wakes it
    "od": {
        "repo": "local/m1",
        "source": f"local:{models_dir}/{'tiny-b' if dry else 'm1'}",
        "served_name": "od",
        "port": 8104,
        "gpus": all_gpus,
        "tensor_parallel": gpus,
        "gpu_memory_utilization": 0.2,
        "max_model_len": 4096,
        "sleep": "level1",
        "on_demand": True,
        "load_deadline_s": 600,
        "wake_deadline_s": 60,
        "args": engine_args,
        "env": {**env, **({"STANDIN_GPU_MIB": "28000"} if dry else {})},
    },
}
lines = [
    'state_dir = "/var/lib/orchestrator"',
    'socket_group = "orchestrator"',
    "",
    "[defaults]",
    'user = "vllm"',
    'group = "vllm"',
    'bind = "127.0.0.1"',
    "",
    "[proxy]",
    "enabled = true",
    "port = 8000",
    'bind = "127.0.0.1"',
    "",
    "[hosts.box]",
    'transport = "local"',
    f"gpus = {gpus}",
    "gpu_memory_gib = 140",
    f'models_dir = "{models_dir}"',
    f"engine = {toml(engine)}",
    "memory_gib = 120",
    "sleep_ram_gib = 60",
]
if dry:  # the stand-in's GPU through its NVML library (there.sh puts it on the agent's LD_LIBRARY_PATH)
    lines.append('gpu_probe = "nvml"')
if os.environ.get("PYKEY") == "1":
    lines.append('python = "/opt/orchestrator/venv/bin/python"')
for name, entry in models.items():
    lines += ["", f"[models.{name}]", 'host = "box"'] + [f"{k} = {toml(v)}" for k, v in entry.items()]
lines += ["", "[demand]", "max_swaps_per_min = 30"]
print("\n".join(lines))
