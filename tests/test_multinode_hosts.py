"""A native multi-node model (the stand-in engine as every rank) across two test hosts in their own
network namespaces, driven by the agent on h1 (h1 over D-Bus, h2 over SSH across the bridge):
a crash in the middle of a step resumes per node, the watch acts on a rank that died, status reads
every node live, a switch to a single-box model and back, and a single-box switch on h2 that would
take GPUs from the multi-node model's rank there is refused.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.agent import sigkill_agent
from tests.hosts.machine import Host, in_host
from tests.hosts.pool import HostSet
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import CONFIG, HOOKS, STATE, active, cli, history, install_agent

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "tests" / "standin" / "vllm_compat.py"
KEY, KNOWN = "/etc/orchestrator-test-key", "/etc/orchestrator-test-known-hosts"
PY = sys.executable
BIG, BIG_NODE = "vllm-big.service", "vllm-big-node1.service"

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def pair(netns_pair: HostSet) -> list[Host]:
    """The session's pair of hosts in network namespaces (tests/hosts/fixtures.py)."""
    return netns_pair.hosts


def config(h1: Host, h2: Host, on_unhealthy: str) -> str:
    head = (
        f'state_dir = "{STATE}"\nmetrics_port = 19464\n[defaults]\nuser = "root"\ngroup = "root"\n'
        "allow_root = true\n"
        f'engine = ["{in_host(PY)}", "{in_host(SHIM)}"]\nload_deadline_s = 30\nfree_timeout_s = 10\n'
        "stop_timeout_s = 10\nhealth_interval_s = 0.1\nrestart_sec = 0.5\n"
        f'[policy]\nwatch_interval_s = 1\nunhealthy_after_s = 2\non_unhealthy = "{on_unhealthy}"\n'
    )
    hosts = "".join(
        f'[hosts.{h.name}]\ntransport = "{transport}"\naddress = "{h.address}"\nbind = "{h.address}"\n'
        f'ssh_port = {h.port}\nssh_key = "{KEY}"\nknown_hosts = "{KNOWN}"\ngpus = 8\ngpu_memory_gib = 96\n'
        f'python = "{PY}"\n'
        for h, transport in ((h1, "local"), (h2, "ssh"))
    )
    common = 'repo = "test/m"\nsource = "none"\ngpus = [0, 1, 2, 3]\ntensor_parallel = 4\n'
    models = (
        f'[models.big]\n{common}nodes = ["{h1.name}", "{h2.name}"]\npipeline_parallel = 2\nport = 8301\n'
        'master_port = 29701\nargs = ["--load-time", "0.3"]\n'
        f'[models.big-mute]\n{common}nodes = ["{h1.name}", "{h2.name}"]\npipeline_parallel = 2\n'
        'port = 8302\nmaster_port = 29702\nargs = ["--health-ok-but-completions-fail"]\n'
        f'[models.small1]\n{common}host = "{h1.name}"\nport = 8303\nargs = ["--load-time", "0.3"]\n'
        f'[models.small2]\n{common}host = "{h2.name}"\nport = 8304\nargs = ["--load-time", "0.3"]\n'
    )
    return head + hosts + models


@pytest.fixture
def agent(pair: list[Host], tmp_path: Path) -> Iterator[Callable[[str], list[Host]]]:
    """Starts h1's agent (for h1 and h2) with the given on_unhealthy policy; both hosts reset after."""
    h1, h2 = pair
    h1.write_file(KEY, Path(h2.key_path).read_text(), mode=0o600)
    h1.write_file(KNOWN, Path(h2.known_hosts_path).read_text())

    def start(on_unhealthy: str = "restart") -> list[Host]:
        install_agent(h1, config(h1, h2, on_unhealthy), tmp_path)
        return pair

    yield start
    h1.run("systemctl stop orchestrator-agent.service", check=False)
    for h in pair:
        h.reset()


def props(host: Host, unit: str) -> tuple[str, str, str]:
    """(InvocationID, MainPID, NRestarts): the same three only while the very same start runs."""
    out = host.run(["systemctl", "show", "-p", "InvocationID", "-p", "MainPID", "-p", "NRestarts", unit]).stdout
    got = dict(line.split("=", 1) for line in out.split())
    return got["InvocationID"], got["MainPID"], got["NRestarts"]


def switch(h1: Host, model: str) -> dict[str, Any]:
    result = cli(h1, "switch", model, "--json", check=False)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def status(h1: Host) -> dict[str, Any]:
    return dict(json.loads(cli(h1, "status", "--json").stdout)["hosts"])


def crash_and_resume(h1: Host, model: str, pause_on: str, at_pause: Callable[[], Any]) -> tuple[Any, list[Any]]:
    """Switch to MODEL through the agent, SIGKILL the agent when the engine reports PAUSE_ON (after
    calling AT_PAUSE), let systemd restart it; returns AT_PAUSE's value and the history once it ended."""
    h1.write_file(f"{HOOKS}/pause-on", pause_on)
    h1.run(
        f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', model, '--config', CONFIG])} > /tmp/switch.log 2>&1 &"
    )
    wait_for(
        lambda: h1.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0,
        what=f"the engine to pause at {pause_on}",
        timeout=60,
    )
    seen = at_pause()
    sigkill_agent(h1, "pause-on paused")
    return seen, wait_for(
        lambda: history(h1),
        lambda h: h[0]["outcome"] in ("active", "rolled_back", "failed", "aborted"),
        what="the interrupted deployment to end",
        timeout=90,
    )


def test_crash_after_the_headless_rank_started_resumes_without_restarting_it(
    agent: Callable[[str], list[Host]],
) -> None:
    """SIGKILL once h2's rank is started and rank 0 is not: the restarted agent finishes the one
    deployment (active) and h2's rank is the very same start (InvocationID, MainPID, NRestarts)."""
    h1, h2 = agent("restart")

    def at_pause() -> tuple[str, ...]:
        assert (active(h2, BIG_NODE), active(h1, BIG)) == ("active", "inactive")
        return props(h2, BIG_NODE)

    before, done = crash_and_resume(h1, "big", f"node_started {h2.name}", at_pause)
    assert [(d["model"], d["outcome"]) for d in done] == [("big", "active")], done[0].get("error")
    assert props(h2, BIG_NODE) == before
    assert (active(h2, BIG_NODE), active(h1, BIG)) == ("active", "active")
    started = [(p["phase"], p["node"]) for p in done[0]["node_progress"] if p["step"] == "started"]
    assert started == [("starting", h2.name), ("starting", h1.name)]


def test_crash_during_rollback_resumes_without_restarting_what_came_back(agent: Callable[[str], list[Host]]) -> None:
    """big-mute fails its completions and rolls back to big; SIGKILL once big's rank is back on h2:
    the resumed rollback leaves that rank running (same start) and ends rolled_back with big serving."""
    h1, h2 = agent("restart")
    switch(h1, "big")
    before, done = crash_and_resume(h1, "big-mute", f"node_started {h2.name} {BIG_NODE}", lambda: props(h2, BIG_NODE))
    newest = done[0]
    assert (newest["model"], newest["outcome"]) == ("big-mute", "rolled_back"), newest.get("rollback_error")
    assert props(h2, BIG_NODE) == before
    assert [
        active(h2, BIG_NODE),
        active(h1, BIG),
        active(h2, "vllm-big-mute-node1.service"),
        active(h1, "vllm-big-mute.service"),
    ] == ["active", "active", "inactive", "inactive"]


def test_watch_restarts_every_node_when_the_rank_on_h2_is_killed(agent: Callable[[str], list[Host]]) -> None:
    """SIGKILL of h2's rank (systemd brings the process back alone; rank 0 still answers /health):
    the watch calls the model unhealthy and redeploys it on every node (watch:restart, active)."""
    h1, h2 = agent("restart")
    switch(h1, "big")
    killed = props(h2, BIG_NODE)
    h2.run(["systemctl", "kill", "-s", "KILL", BIG_NODE])
    done = wait_for(
        lambda: history(h1),
        lambda h: h[0]["trigger"] == "watch:restart" and h[0]["outcome"] == "active",
        what="the watch to redeploy big on every node",
        timeout=90,
    )
    assert [d["model"] for d in done] == ["big", "big"]
    assert (active(h2, BIG_NODE), active(h1, BIG)) == ("active", "active")
    assert props(h2, BIG_NODE)[0] != killed[0]
    serving = status(h1)[h1.name]["serving"]
    assert serving["healthy"] is True and [n["restarts"] for n in serving["nodes"]] == [0, 0]


def test_watch_rolls_back_to_the_single_box_model_when_a_rank_is_lost(agent: Callable[[str], list[Host]]) -> None:
    """on_unhealthy = rollback: a killed rank on h2 brings small1 back on h1 and stops big everywhere."""
    h1, h2 = agent("rollback")
    switch(h1, "small1")
    switch(h1, "big")
    h2.run(["systemctl", "kill", "-s", "KILL", BIG_NODE])
    done = wait_for(
        lambda: history(h1),
        lambda h: "watch" in h[0]["trigger"] and h[0]["outcome"] == "active",
        what="the watch to roll back to small1",
        timeout=90,
    )
    assert done[0]["model"] == "small1"
    assert [active(h1, "vllm-small1.service"), active(h1, BIG), active(h2, BIG_NODE)] == [
        "active",
        "inactive",
        "inactive",
    ]


def test_status_shows_every_nodes_role_and_unit_state_live(agent: Callable[[str], list[Host]]) -> None:
    """status (JSON and text) after the switch: each node's role and unit state; after h2's rank was
    killed (on_unhealthy = record): not healthy, h2's unit restarted by systemd on its own."""
    h1, h2 = agent("record")
    switch(h1, "big")
    hosts = status(h1)
    rows = [(n["host"], n["role"], n["unit"], n["state"]) for n in hosts[h1.name]["serving"]["nodes"]]
    assert rows == [(h2.name, "headless rank 1", BIG_NODE, "active"), (h1.name, "rank 0 (API)", BIG, "active")]
    assert hosts[h2.name]["node_of"] == [{"model": "big", "head": h1.name, "revision": 1, "units": [BIG_NODE]}]
    text = cli(h1, "status").stdout
    assert f"node {h2.name}: headless rank 1, {BIG_NODE} active" in text
    assert f"{h2.name}: a node of big (revision 1, headed on {h1.name}: {BIG_NODE})" in text
    h2.run(["systemctl", "kill", "-s", "KILL", BIG_NODE])
    lost = wait_for(
        lambda: status(h1)[h1.name]["serving"],
        lambda s: s["nodes"][0].get("restarts") == 1,
        what="systemd to bring h2's rank back alone",
    )
    assert lost["healthy"] is False and lost["nodes"][1]["restarts"] == 0
    assert f"{BIG_NODE} active (restarted 1x by systemd on its own)" in cli(h1, "status").stdout
    assert "not healthy" in cli(h1, "status").stdout


def test_multinode_to_single_box_and_back(agent: Callable[[str], list[Host]]) -> None:
    """big (h1+h2) -> small1 on h1's same GPUs -> big: after each step exactly the expected units run."""
    h1, h2 = agent("record")

    def running() -> tuple[list[str], list[str]]:
        units = [BIG, BIG_NODE, "vllm-small1.service", "vllm-small2.service"]
        return ([u for u in units if active(h1, u) == "active"], [u for u in units if active(h2, u) == "active"])

    assert switch(h1, "big")["outcome"] == "active"
    assert running() == ([BIG], [BIG_NODE])
    assert switch(h1, "small1")["outcome"] == "active"
    assert running() == (["vllm-small1.service"], [])
    assert switch(h1, "big")["outcome"] == "active"
    assert running() == ([BIG], [BIG_NODE])
    assert [(d["model"], d["outcome"]) for d in history(h1)] == [
        ("big", "active"),
        ("small1", "active"),
        ("big", "active"),
    ]


def test_single_box_switch_on_a_rank_node_is_refused_before_anything_stops(agent: Callable[[str], list[Host]]) -> None:
    """small2 needs h2's GPUs 0-3 where big's rank 1 runs: exit 5 naming big, its head and the stop
    command; h2's rank is untouched and nothing is recorded."""
    h1, h2 = agent("record")
    switch(h1, "big")
    before = props(h2, BIG_NODE)
    refused = cli(h1, "switch", "small2", check=False)
    assert refused.returncode == 5, refused.stderr
    assert f"{BIG_NODE} runs a rank of multi-node model big (headed on {h1.name})" in refused.stderr
    assert "`orchestrator stop big`" in refused.stderr and "Traceback" not in refused.stderr
    assert props(h2, BIG_NODE) == before and active(h2, "vllm-small2.service") == "inactive"
    assert [d["model"] for d in history(h1)] == ["big"]
    stopped = cli(h1, "stop", "big", check=False)
    assert stopped.returncode == 0, stopped.stderr
    assert (active(h1, BIG), active(h2, BIG_NODE)) == ("inactive", "inactive")
    assert switch(h1, "small2")["outcome"] == "active"
