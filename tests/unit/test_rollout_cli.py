"""`rollout status` as a client: through the controller it loads no catalog (deploy.toml read as TOML
for the socket, as `status` does); its JSON says whether an abort was requested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.core.rollout import Policy
from orchestrator.rollout.store import RolloutStore
from tests.builders.agent_socket import StandInAgent
from tests.builders.catalog import ONE_BOX_TOML

from .test_cli_start import probe
from .test_rollout_status import dead_pid

SUMMARY = {
    "rollout": {
        "id": 3,
        "model": "beta",
        "group": "inference",
        "status": "running",
        "reason": None,
        "started_by": "alice@socket",
        "abort_requested": False,
    },
    "hosts": [],
}


def cli_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    config = tmp_path / "deploy.toml"
    config.write_text(ONE_BOX_TOML.format(state=tmp_path / "state", extra=""))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    return config, {**env, "ORCHESTRATOR_CONFIG": str(config)}


def test_rollout_status_through_the_controller_loads_no_catalog(tmp_path: Path) -> None:
    """With the controller on deploy.toml's socket: ping, rollout_status; neither pydantic nor the catalog loads."""
    _config, env = cli_env(tmp_path)
    (tmp_path / "state").mkdir()
    controller = StandInAgent(tmp_path / "state" / "agent.sock", {"ping": {}, "rollout_status": SUMMARY})
    loaded, code, out = probe(env, "rollout", "status")
    assert (loaded, code) == ([], 0), out
    assert controller.ops == ["ping", "rollout_status"] and "rollout #3 beta on group inference" in out


def test_rollout_status_json_says_an_abort_was_requested(tmp_path: Path) -> None:
    """An in-CLI rollout whose controller died after an abort was asked: --json has abort_requested true,
    and the text says so beside its status."""
    config, env = cli_env(tmp_path)
    (tmp_path / "state").mkdir()
    store = RolloutStore(tmp_path / "state" / "rollouts.db", group=None)
    rid = store.create("beta", "inference", Policy(), "health", [("box",)], dead_pid())
    store.request_abort(rid)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", "rollout", "status", "--json", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rollout"]["abort_requested"] is True
    text = subprocess.run(
        [sys.executable, "-m", "orchestrator", "rollout", "status", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert f"rollout #{rid} beta on group inference: interrupted (abort requested): " in text.stdout, text.stderr
