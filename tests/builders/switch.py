"""deploy.toml for one test host with the stand-in engine: the switch host tests' and bench's builder."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.hosts.machine import Host, in_host

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "standin" / "vllm_compat.py"


def config_text(host: Host, state_dir: Path, models: dict[str, dict[str, Any]], *, transport: str = "ssh") -> str:
    lines = [
        f'state_dir = "{state_dir}"',
        "metrics_port = 19464",
        "[defaults]",
        'user = "root"',
        'group = "root"',
        "allow_root = true",
        f'engine = ["{in_host(sys.executable)}", "{in_host(SHIM)}"]',
        "load_deadline_s = 30",
        "free_timeout_s = 10",
        "stop_timeout_s = 10",
        "health_interval_s = 0.1",
        "restart_sec = 0.5",
        "[policy]",
        "watch_interval_s = 1",
        "unhealthy_after_s = 2",
        f"[hosts.{host.name}]",
        f'transport = "{transport}"',
        f'address = "{host.address}"',
        f'bind = "{host.address}"',
        f"ssh_port = {host.port}",
        f'ssh_key = "{host.key_path}"',
        f'known_hosts = "{host.known_hosts_path}"',
        "gpus = 8",
        "gpu_memory_gib = 96",
        f'python = "{sys.executable}"',
    ]
    for name, fields in models.items():
        lines.append(f"[models.{name}]")
        base = {"repo": f"test/{name}", "source": "none", "tensor_parallel": 4, "gpus": [0, 1, 2, 3]}
        for key, value in {**base, **fields}.items():
            rendered = str(value).lower() if isinstance(value, bool) else repr(value).replace("'", '"')
            lines.append(f"{key} = {rendered}")
    return "\n".join(lines) + "\n"


MODELS: dict[str, dict[str, Any]] = {
    "alpha": {"port": 8101, "args": ["--load-time", "0.3"]},
    "beta": {"port": 8102, "args": ["--load-time", "0.3"]},
    "beta-slow": {"port": 8103, "args": ["--load-time", "600"], "load_deadline_s": 3},
    "beta-crash": {"port": 8104, "args": ["--refuse-to-start"]},
    "beta-mute": {"port": 8105, "args": ["--health-ok-but-completions-fail"]},
    "beta-long": {"port": 8106, "args": ["--load-time", "4"]},
    "gamma": {"port": 8107, "gpus": [4, 5, 6, 7], "args": ["--load-time", "0.3"]},
}
