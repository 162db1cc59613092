"""What the three switchers share: the models, the orchestrator's deploy.toml and the hand-made unit.

Every method starts the same engine command line (the stand-in behind vLLM's flags, with a fixed
load time L and stop time S) on the same GPUs, so the only difference left is the tool.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.hosts.machine import Host, in_host

REPO = Path(__file__).resolve().parents[2]
SHIM = REPO / "tests" / "standin" / "vllm_compat.py"
GPUS = (0, 1, 2, 3)
LOCAL_CONFIG = "/etc/orchestrator-bench/deploy.toml"  # on the test host
LOCAL_STATE = "/var/lib/orchestrator-bench"


@dataclass(frozen=True)
class BenchModel:
    name: str
    port: int
    repo: str = ""  # empty: weights already present (source "none")
    revision: str = "main"

    @property
    def unit(self) -> str:
        return f"vllm-{self.name}.service"


@dataclass(frozen=True)
class Timing:
    load_s: float  # L: the stand-in answers nothing for this long after its process starts
    stop_s: float  # S: after SIGTERM it closes its port at once, then takes this long to exit

    def args(self) -> list[str]:
        return ["--load-time", f"{self.load_s:g}", "--stop-time", f"{self.stop_s:g}", "--listen-after-load"]


@dataclass
class Bench:
    host: Host
    work: Path  # local scratch folder (deploy.toml, state, inventory)
    timing: Timing
    models: list[BenchModel] = field(default_factory=list)

    def model(self, name: str) -> BenchModel:
        return next(m for m in self.models if m.name == name)

    def unit_text(self, m: BenchModel) -> str:
        """The unit every tool writes for ``m``: the text the orchestrator renders from deploy.toml.

        The same bytes from every tool means that, as in steady-state switching with any one tool,
        each finds the unit it is about to start already written and unchanged.
        """
        from orchestrator import settings
        from orchestrator.core.render import render_unit
        from orchestrator.deploy.planning import default_template

        catalog = settings.load(self.work / "deploy.toml")
        return render_unit(catalog, catalog.models[m.name], default_template()).text

    def deploy_text(self, *, local: bool = False) -> str:
        """deploy.toml for the controller (ssh transport), or for the host itself (local: D-Bus)."""
        h = self.host
        state = LOCAL_STATE if local else self.work / "state"
        lines = [
            f'state_dir = "{state}"',
            "[defaults]",
            'user = "root"',
            'group = "root"',
            "allow_root = true",
            f'engine = ["{in_host(sys.executable)}", "{in_host(SHIM)}"]',
            "load_deadline_s = 120",
            "stop_timeout_s = 30",
            "free_timeout_s = 30",
            "health_interval_s = 0.2",
            "restart_sec = 10",
            f"[hosts.{h.name}]",
            f'transport = "{"local" if local else "ssh"}"',
            f'address = "{h.address}"',
            f'bind = "{h.address}"',
            "gpus = 8",
            "gpu_memory_gib = 96",
            'models_dir = "/models"',
            f'python = "{sys.executable}"',
        ]
        if not local:
            lines += [f"ssh_port = {h.port}", f'ssh_key = "{h.key_path}"', f'known_hosts = "{h.known_hosts_path}"']
        for m in self.models:
            lines += [
                f"[models.{m.name}]",
                f"port = {m.port}",
                f"gpus = {list(GPUS)}",
                f"tensor_parallel = {len(GPUS)}",
                f"args = {self.timing.args()!r}".replace("'", '"'),
            ]
            if m.repo:
                lines += [f'repo = "{m.repo}"', 'source = "hub"', f'revision = "{m.revision}"']
            else:
                lines += [f'repo = "bench/{m.name}"', 'source = "none"']
        return "\n".join(lines) + "\n"

    def deploy_toml(self) -> Path:
        """Write both configs: here for the CLI over ssh, and on the host for the local transport."""
        path = self.work / "deploy.toml"
        path.write_text(self.deploy_text())
        self.host.write_file(LOCAL_CONFIG, self.deploy_text(local=True))
        return path
