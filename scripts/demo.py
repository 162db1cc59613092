"""The README demo: a real switch with the real vLLM engine (CPU build) on a local systemd test host.

Boots one test host (systemd-nspawn: systemd as PID 1, D-Bus, sshd on 127.0.0.x), writes a deploy
config for three tiny generated models, and drives the real CLI over SSH: switch to tiny-a, switch
to tiny-b, switch to tiny-broken (which fails and rolls back to tiny-b), then status and history.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.vllm_config import vllm_config_text
from tests.hosts.pool import boot_hosts


def orchestrator(*args: str, config: Path) -> int:
    cmd = [sys.executable, "-m", "orchestrator", *args, "--config", str(config)]
    print(f"\n$ orchestrator {' '.join(args)}", flush=True)
    return subprocess.run(cmd, cwd=REPO, check=False).returncode


def main() -> int:
    models = os.environ.get("ORCHESTRATOR_TEST_MODELS", "/var/lib/orchestrator-test/models")
    hostset = boot_hosts(1)
    try:
        tmp = tempfile.mkdtemp(prefix="orchestrator-demo-")
        host = hostset.hosts[0]
        print(f"test host {host.name} booted: systemd + D-Bus + sshd on {host.address}", flush=True)
        config = Path(tmp) / "deploy.toml"
        config.write_text(vllm_config_text(host, Path(tmp) / "state", models))
        codes = [
            orchestrator("switch", "tiny-a", config=config),
            orchestrator("switch", "tiny-b", config=config),
            orchestrator("switch", "tiny-broken", config=config),
        ]
        orchestrator("status", config=config)
        orchestrator("history", config=config)
        expected = [0, 0, 1]  # the broken model must fail and roll back
        print(f"\nexit codes {codes} (expected {expected}: the broken model rolls back to tiny-b)")
        return 0 if codes == expected else 1
    finally:
        hostset.close()


if __name__ == "__main__":
    sys.exit(main())
