"""`tune` through an agent: the run is a job of the agent that owns the model's host (agent/tune_jobs.py),
so the CLI that started it can die and any other client re-attaches, resumes or aborts it.

The agent runs on this machine with a deploy.toml whose host h1 (a systemd test host) it reaches over
SSH; every client is a CLI with the same file, so it reaches the agent's socket. The stand-in engine
streams tp4 faster than tp2 (tests/test_tune_hosts.py's set-up); each level runs 2 s, so a candidate
is measured some seconds after the one before and the tests can act in between.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.wiring import operations
from tests.builders.agent import REPO
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_switch_hosts import MODELS, config_text, unit_states
from tests.test_tune_hosts import TINY, TINY_ENV, _measured, history, put_tiny

pytestmark = pytest.mark.hosts

RUN = [
    "tune",
    "tiny",
    "--layouts",
    "tp2,tp4",
    "--concurrency",
    "1,4",
    "--duration",
    "2",
    "--max-tokens",
    "16",
    "--prompt-tokens",
    "8",
    "--yes",
    "--json",
]


class TuneAgent:
    """The agent that owns h1, started (and SIGKILLed) by the test; clients are CLIs of the same file."""

    def __init__(self, cfg: Path, state: Path, log: Path) -> None:
        self.cfg, self.state, self.log = cfg, state, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator", "agent", "--config", str(self.cfg), "--metrics-port", "0"],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc
        wait_for(lambda: self.answers() or proc.poll() is not None, timeout=60, what="the agent to answer")
        assert proc.poll() is None, self.log.read_text()

    def answers(self) -> bool:
        from orchestrator.client.backends import AgentClient
        from orchestrator.contract.ops import PING
        from orchestrator.errors import OrchestratorError

        try:
            AgentClient(str(self.state / "agent.sock")).call(PING, {})
        except OrchestratorError:
            return False
        return True

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "orchestrator", *args, "--config", str(self.cfg)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "orchestrator", *args, "--config", str(self.cfg)],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def await_measured(self, n: int) -> None:
        wait_for(lambda: _measured(self.state), lambda got: got >= n, timeout=120, what=f"{n} candidate(s) measured")


@pytest.fixture
def agent(host: Host, tmp_path: Path) -> Iterator[TuneAgent]:
    put_tiny(host)
    state = tmp_path / "state"
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(host, state, {"alpha": MODELS["alpha"], "tiny": TINY}) + TINY_ENV)
    assert operations(settings.load(cfg)).switch("alpha")["outcome"] == "active"
    running = TuneAgent(cfg, state, tmp_path / "agent.log")
    running.start()
    try:
        yield running
    finally:
        running.stop()


def _tp2_benched(cfg: Path) -> int:
    return len([h for h in history(cfg) if h["model"] == "tiny.tp2" and h["bench"]])


def test_a_tune_survives_the_cli_that_started_it_and_another_client_follows_it_to_its_report(
    agent: TuneAgent, host: Host
) -> None:
    """The CLI is SIGKILLed after the first candidate: the agent goes on; `tune --follow` from another
    client gets the report (tp4 wins, serves); each layout was measured once."""
    first = agent.popen(*RUN)
    agent.await_measured(1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    status = json.loads(agent.cli("tune", "--status", "--json").stdout)
    assert status["run"]["model"] == "tiny" and status["run"]["candidates"] == ["tiny.tp2", "tiny.tp4"]
    followed = agent.cli("tune", "--follow", "--json")
    assert followed.returncode == 0, followed.stderr
    report = json.loads(followed.stdout)
    assert report["decision"]["winner"] == "tiny.tp4" and report["serving"]["model"] == "tiny.tp4"
    assert _measured(agent.state) == 2 and _tp2_benched(agent.cfg) == 1
    assert unit_states(host, "alpha", "tiny.tp4") == {"alpha": "inactive", "tiny.tp4": "active"}


def test_the_agent_killed_mid_run_resumes_it_on_restart_and_another_client_attaches_with_resume(
    agent: TuneAgent, host: Host
) -> None:
    """SIGKILL the agent after the first candidate: started again it resumes the run; `tune --resume
    --apply` from another client follows it to the report and writes the winner's layout into the
    agent's deploy.toml (a config push); tp2 is not measured twice."""
    first = agent.popen(*RUN)
    agent.await_measured(1)
    agent.kill()
    _out, err = first.communicate(timeout=60)
    assert first.returncode != 0 and "tune --follow" in err, err  # it lost the agent: detached
    agent.start()
    resumed = agent.cli("tune", "--resume", "--yes", "--apply", "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["decision"]["winner"] == "tiny.tp4" and report["serving"]["model"] == "tiny.tp4"
    assert _measured(agent.state) == 2 and _tp2_benched(agent.cfg) == 1
    assert report["applied"] and settings.load(agent.cfg).models["tiny"].tensor_parallel == 4


def test_abort_from_another_client_stops_the_run_before_its_next_candidate(agent: TuneAgent, host: Host) -> None:
    """`tune --abort` while the agent measures: the run ends aborted, alpha serves again, the CLI that
    started it exits 1 saying so."""
    first = agent.popen(*RUN)
    wait_for(
        lambda: json.loads(agent.cli("tune", "--status", "--json").stdout)["running"] == "tune_start",
        bool,
        timeout=120,
        what="the agent to run the tune",
    )  # the run, not its plan
    aborted = agent.cli("tune", "--abort", "--json")
    assert aborted.returncode == 0, aborted.stderr
    assert json.loads(aborted.stdout)["state"] == "aborted"
    out, err = first.communicate(timeout=120)
    assert first.returncode == 1 and json.loads(out)["state"] == "aborted", err
    assert unit_states(host, "alpha", "tiny.tp2", "tiny.tp4")["alpha"] == "active"
    assert "no unfinished tune run" in agent.cli("tune", "--resume").stderr
