"""The CLI run by a user who is not root (a forked child that drops to uid nobody): read-only commands
work where they need no records, and the rest name the command and the rule instead of a traceback."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.builders.as_account import run_as
from tests.unit.cli_runner import invoke

NOBODY = 65534
LAZY = ("urllib.request",)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="drops from root to uid nobody")

CONFIG = """state_dir = "{state}"
[hosts.box]
transport = "local"
gpus = 8
gpu_memory_gib = 96
[models.a]
repo = "org/a"
config = "shipped:MiniMaxAI__MiniMax-M2.5.json"
gpus = [0, 1, 2, 3]
tensor_parallel = 4
"""


@pytest.fixture()
def box() -> Iterator[Path]:
    """A deploy.toml anyone may read, whose state_dir holds root's records (0700, state.db 0600)."""
    top = Path(tempfile.mkdtemp(prefix="probe-nonroot-"))
    top.chmod(0o755)
    state = top / "state"
    state.mkdir(mode=0o700)
    (state / "state.db").write_bytes(b"")
    (state / "state.db").chmod(0o600)
    (top / "deploy.toml").write_text(CONFIG.format(state=state))
    (top / "deploy.toml").chmod(0o644)
    try:
        yield top / "deploy.toml"
    finally:
        shutil.rmtree(top)


def _imported_here(configs: bool = True) -> None:
    """This interpreter and the checkout may live where nobody cannot read (pyenv under /root, a clone
    in `mktemp -d`): the child imports nothing new and reads no package file, so every module the
    commands import lazily is imported, and the shipped config.json files read, before the fork."""
    import orchestrator
    from orchestrator import resources

    if configs:
        resources.shipped_configs()
    for info in pkgutil.walk_packages(orchestrator.__path__, "orchestrator."):
        if not info.name.startswith(("orchestrator.testing", "orchestrator.__main__")):
            importlib.import_module(info.name)
    for name in LAZY:
        importlib.import_module(name)


def as_nobody(*args: str, configs: bool = True) -> dict[str, object]:
    """The CLI in a child process running as uid/gid nobody: its exit code, stdout and stderr."""
    _imported_here(configs)

    def command() -> str:
        os.environ.pop("ORCHESTRATOR_STATE_DIR", None)
        result = invoke(*args)
        return json.dumps(
            {
                "code": result.exit_code,
                "stdout": result.stdout,
                "stderr": result.stderr,
                "exception": repr(result.exception),
            }
        )

    return dict(json.loads(run_as(NOBODY, NOBODY, command)))


def test_plan_works_for_a_user_who_cannot_read_the_records(box: Path) -> None:
    """`plan` needs no records for its verdict: a non-root user gets it (it was a PermissionError traceback)."""
    result = as_nobody("plan", "a", "--config", str(box))
    assert result["code"] == 0, result
    assert str(result["stdout"]).startswith("a as TP=4 on 8 x 96 GiB: valid")


@pytest.mark.parametrize("command", [["status"], ["history"], ["switch", "a"], ["rollback"]])
def test_a_command_that_needs_the_records_names_itself_and_the_rule(box: Path, command: list[str]) -> None:
    """Without an agent a non-root user's command names itself, the uid, and the two ways it can run."""
    result = as_nobody(*command, "--config", str(box))
    assert result["code"] == 2, result
    assert (
        f"Permission denied; `orchestrator {command[0]}` found no agent to ask, so it uses the state directory "
        f"itself, which only root may (uid {NOBODY} here): run it as root, or through the agent"
    ) in str(result["stderr"])


def test_an_unreadable_deploy_toml_is_named_without_the_state_directory_hint(box: Path) -> None:
    """A deploy.toml only root may read is refused naming the file; the state directory is not blamed."""
    box.chmod(0o600)
    result = as_nobody("models", "--config", str(box))
    assert (result["code"], result["stderr"]) == (2, f"error: {box}: cannot read: Permission denied\n")


def test_unreadable_shipped_configs_are_named(box: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package whose configs/ this user may not read: exit 2 naming the directory, not a bare PermissionError."""
    from orchestrator import resources

    hidden = tmp_path / "configs"
    hidden.mkdir(mode=0o700)
    monkeypatch.setattr(resources, "SHIPPED_CONFIGS", hidden)
    resources.shipped_configs.cache_clear()
    try:
        result = as_nobody("plan", "a", "--config", str(box), configs=False)
    finally:
        resources.shipped_configs.cache_clear()
    assert result["code"] == 2, result
    assert (
        f"models.a.config: 'shipped:MiniMaxAI__MiniMax-M2.5.json': cannot read the package's shipped configs: "
        f"{hidden}: Permission denied" in str(result["stderr"])
    )


@pytest.mark.parametrize("script", ["scripts/setup.sh", "scripts/demo.sh"])
def test_setup_and_the_demo_say_they_need_root(script: str) -> None:
    """The README's first command run as another user says it needs root and why, before touching anything."""
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", "bash", script],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.startswith(f"scripts/setup.sh: run it as root (uid {NOBODY} here): it installs apt packages")


@pytest.fixture()
def member_agent() -> Iterator[tuple[Path, str]]:
    """An agent whose socket group is nogroup (nobody's), its socket and a deploy.toml 0640 root:root in a
    folder anyone may enter: (deploy.toml, socket)."""
    import threading

    from orchestrator.agent.daemon import Agent
    from orchestrator.agent.server import ControlServer
    from tests.unit.conftest import OpsWorld

    top = Path(tempfile.mkdtemp(prefix="member-"))
    top.chmod(0o755)
    world = OpsWorld(top / "state", socket_group="nogroup")
    (top / "state").mkdir(exist_ok=True)
    (top / "state").chmod(0o755)
    sock = str(top / "state" / "agent.sock")
    agent = Agent(world.catalog, world.ops, socket=sock, metrics_port=None, clock=world.clock)
    server = ControlServer(sock, agent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = top / "deploy.toml"
    cfg.write_text(CONFIG.format(state=top / "state"))
    cfg.chmod(0o640)
    try:
        yield cfg, sock
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(top)


def test_a_socket_group_member_on_the_box_reaches_the_agent_past_a_deploy_toml_only_root_reads(
    member_agent: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy.toml 0640 root:root: a member's `status` asks the box's agent (as the SSH relay finds it),
    not "file not found"."""
    cfg, sock = member_agent
    monkeypatch.setenv("ORCHESTRATOR_SOCKET", sock)
    result = as_nobody("status", "--config", str(cfg))
    assert result["code"] == 0, result
    assert str(result["stdout"]).startswith("box: "), result


def test_without_a_deploy_toml_here_the_cli_asks_the_boxs_agent(
    member_agent: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --config and no ./deploy.toml where it runs: `status` asks the box's agent instead of "file not found"."""
    _cfg, sock = member_agent
    monkeypatch.setenv("ORCHESTRATOR_SOCKET", sock)
    monkeypatch.delenv("ORCHESTRATOR_CONFIG", raising=False)
    monkeypatch.chdir(tempfile.gettempdir())
    assert not Path("deploy.toml").exists()
    result = as_nobody("status")
    assert result["code"] == 0, result
    assert str(result["stdout"]).startswith("box: "), result
