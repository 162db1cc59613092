"""What the socket group may do: a member (a real non-root client, uid nobody in the socket group)
pushes configs that change models and policy, but never what the agent runs or writes as root, as
whom the engines run, or who may use the socket; root may. Root-writable proxy paths stay in the
product's directories for everyone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.agent.daemon import Agent
from orchestrator.agent.server import ControlServer
from orchestrator.core.catalog import Catalog
from orchestrator.core.privilege import root_only_changes
from orchestrator.deploy.operations import Operations
from orchestrator.errors import ConfigError
from orchestrator.testing import FakeClock, FakeHost, FakeStateStore, FakeWeights

NOBODY = 65534  # uid nobody, gid nogroup: the socket group of these tests
pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="starts a client as another user")

CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(json.dumps({"op": "config_push",
                      "args": {"text": sys.stdin.read(), "name": "pushed.toml"}}).encode() + b"\\n")
s.shutdown(socket.SHUT_WR)
print(s.makefile().read().splitlines()[-1])
"""


def deploy(state: Path, **changes: str) -> str:
    """A deploy.toml; ``changes`` maps 'section.key' (or 'key') to a TOML value replacing the default."""
    tables: dict[str, dict[str, str]] = {
        "": {"state_dir": f'"{state}"', "socket_group": '"nogroup"'},
        "defaults": {"engine": '["/opt/vllm/bin/vllm", "serve"]'},
        "hosts.box": {"transport": '"local"', "gpus": "8", "gpu_memory_gib": "96"},
        "models.alpha": {
            "repo": '"org/alpha"',
            "host": '"box"',
            "gpus": "[0, 1, 2, 3]",
            "tensor_parallel": "4",
            "port": "8001",
        },
    }
    for path, value in changes.items():
        table, _, key = path.rpartition(".")
        tables.setdefault(table, {})[key] = value
    out = "".join(f"{k} = {v}\n" for k, v in tables.pop("").items())
    for table, keys in tables.items():
        out += f"[{table}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
    return out


@dataclass
class Box:
    root: Path
    config: Path
    agent: Agent
    server: ControlServer

    def push(self, text: str, *, uid: int) -> dict[str, Any]:
        ids: dict[str, Any] = {} if uid == 0 else {"user": uid, "group": NOBODY, "extra_groups": []}
        # The system interpreter: the test venv may sit where nobody can read.
        done = subprocess.run(
            ["/usr/bin/python3", "-c", CLIENT, self.agent.socket],
            input=text,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            **ids,
        )
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))


@pytest.fixture
def box() -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="orchestrator-group-", dir="/tmp"))  # a path nobody can traverse
    root.chmod(0o755)
    state = root / "state"
    state.mkdir(mode=0o755)
    config = root / "deploy.toml"
    config.write_text(deploy(state))
    catalog = settings.load(config)
    host, store = FakeHost(name="box"), FakeStateStore()
    ports = host.ports(catalog.hosts["box"], FakeWeights())

    def ops_for(cat: Catalog) -> Operations:
        return Operations(cat, lambda name: ports, store=store)

    # The socket beside the state dir, not in it: the state dir's mode is the agent's business.
    (root / "run").mkdir(mode=0o755)
    agent = Agent(
        catalog,
        ops_for(catalog),
        socket=str(root / "run" / "agent.sock"),
        metrics_port=None,
        clock=FakeClock(),
        config_path=str(config),
        ops_factory=ops_for,
    )
    server = ControlServer(agent.socket, agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield Box(root, config, agent, server)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(root)


# Each turns the socket group into root (or into another account) if a member may push it.
ESCALATIONS = {
    "engine user daemon": ("defaults.user", '"daemon"'),
    "engine group disk": ("defaults.group", '"disk"'),
    "engine a shell": ("defaults.engine", '["/bin/sh", "-c", "id > /x"]'),
    "host engine": ("hosts.box.engine", '["/bin/sh", "-c", "id"]'),
    "root's python": ("hosts.box.python", '"/home/alice/python"'),
    "unit dir": ("hosts.box.unit_dir", '"/etc/cron.d"'),
    "models dir": ("hosts.box.models_dir", '"/etc"'),
    "ssh key": ("hosts.box.ssh_key", '"/root/.ssh/id_ed25519"'),
    "transport": ("hosts.box.transport", '"ssh"'),
    "new ssh host": ("hosts.other.address", '"10.0.0.9"'),
    "ray": ("defaults.ray", '"/home/alice/ray"'),
    "env dir": ("defaults.env_dir", '"/home/alice/env"'),
    "haproxy": ("proxy.haproxy", '"/home/alice/haproxy"'),
    "haproxy's account": ("proxy.user", '"daemon"'),
    "socket group": ("socket_group", '"users"'),
    "dashboard socket": ("dashboard.socket", '"/etc/victim-file.sock"'),
    "local weights": ("models.alpha.source", '"local:/root/weights"'),
}


@pytest.mark.parametrize("case", list(ESCALATIONS))
def test_a_member_cannot_push_what_only_root_may_change(box: Box, case: str) -> None:
    """A push by a socket-group member changing a root-only setting exits 5 naming it; the file stays."""
    key, value = ESCALATIONS[case]
    before = box.config.read_text()
    reply = box.push(deploy(Path(box.agent.catalog.state_dir), **{key: value}), uid=NOBODY)
    assert reply["error"]["exit_code"] == 5, reply
    assert "only root may change" in reply["error"]["message"] and key in reply["error"]["message"]
    assert box.config.read_text() == before and not (box.config.parent / "deploy.toml.prev").exists()


def test_a_member_may_push_models_and_policy(box: Box) -> None:
    """Models, ports and policy are the group's to change: the push is applied."""
    text = deploy(Path(box.agent.catalog.state_dir), **{"models.alpha.port": "8009", "policy.keep_revisions": "3"})
    reply = box.push(text, uid=NOBODY)
    assert reply["result"]["changed"] is True, reply
    assert box.config.read_text() == text and box.agent.catalog.models["alpha"].port == 8009


def test_a_member_cannot_point_a_model_config_at_a_file_root_reads(box: Box) -> None:
    """A model `config` outside the package's shipped ones is root's to set: a member's push exits 5."""
    (box.root / "config.json").write_text('{"num_attention_heads": 32, "num_key_value_heads": 8}')
    reply = box.push(deploy(Path(box.agent.catalog.state_dir), **{"models.alpha.config": '"config.json"'}), uid=NOBODY)
    assert reply["error"]["exit_code"] == 5 and "models.alpha.config" in reply["error"]["message"], reply


def test_a_member_may_name_a_shipped_model_config(box: Box) -> None:
    """`config = "shipped:NAME"` names a file of the package: a member's push is applied."""
    text = deploy(
        Path(box.agent.catalog.state_dir), **{"models.alpha.config": '"shipped:MiniMaxAI__MiniMax-M2.5.json"'}
    )
    assert box.push(text, uid=NOBODY)["result"]["changed"] is True


def test_root_may_push_a_root_only_change(box: Box) -> None:
    """The same change from root is applied."""
    text = deploy(Path(box.agent.catalog.state_dir), **{"hosts.box.python": '"/opt/orchestrator/venv/bin/python"'})
    assert box.push(text, uid=0)["result"]["changed"] is True
    assert box.agent.catalog.hosts["box"].python == "/opt/orchestrator/venv/bin/python"


@pytest.mark.parametrize(
    "key,value",
    [
        ("proxy.config_path", '"/etc/passwd"'),
        ("proxy.config_path", '"/etc/orchestrator/../passwd.cfg"'),
        ("proxy.config_path", '"/etc/orchestrator/deploy.toml"'),
        ("proxy.stats_socket", '"/run/orchestrator-proxy/../../etc/x.sock"'),
        ("proxy.stats_socket", '"/etc/orchestrator/admin.sock"'),
        ("proxy.stats_socket", '"/run/orchestrator-proxy/master.sock"'),
        ("proxy.haproxy", '"/usr/sbin/../../tmp/haproxy"'),
    ],
)
def test_root_written_proxy_paths_stay_in_the_products_directories(tmp_path: Path, key: str, value: str) -> None:
    """A proxy path outside /etc/orchestrator or /run/orchestrator-proxy, or traversing, is refused for anyone."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(deploy(tmp_path, **{key: value}))
    with pytest.raises(ConfigError, match=key.rsplit(".", 1)[-1]):
        settings.load(cfg)


def test_a_new_host_with_default_settings_is_no_root_only_change(tmp_path: Path) -> None:
    """Adding a local host with its defaults needs no root: only its non-default root-only keys would."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(deploy(tmp_path))
    running = settings.load(cfg)
    cfg.write_text(deploy(tmp_path, **{"hosts.extra.transport": '"local"', "hosts.extra.address": '"127.0.0.1"'}))
    assert root_only_changes(running, settings.load(cfg)) == []


def test_a_pushed_model_config_that_is_a_fifo_does_not_wedge_the_agent(box: Box) -> None:
    """A push whose model `config` names a FIFO is refused at once (exit 2); the agent answers the next push."""
    fifo = box.root / "config.fifo"
    os.mkfifo(fifo)
    state = Path(box.agent.catalog.state_dir)
    reply = box.push(deploy(state, **{"models.alpha.config": f'"{fifo}"'}), uid=0)
    assert reply["error"]["exit_code"] == 2 and "FIFO" in reply["error"]["message"], reply
    assert box.push(deploy(state, **{"models.alpha.port": "8010"}), uid=0)["result"]["changed"] is True


def test_config_push_replaces_a_symlink_planted_at_the_prev_file(box: Box) -> None:
    """A push keeps the old file as deploy.toml.prev without following a symlink planted there."""
    victim = box.root / "victim"
    victim.write_text("precious\n")
    prev = box.config.with_name("deploy.toml.prev")
    prev.symlink_to(victim)
    old = box.config.read_text()
    assert box.push(deploy(Path(box.agent.catalog.state_dir), **{"models.alpha.port": "8011"}), uid=0)["result"]
    assert victim.read_text() == "precious\n" and not prev.is_symlink() and prev.read_text() == old
