"""The CLI as a client of a box's agent over SSH (--host), each test host in its own network namespace.

h1 is the box (agent + stand-in engine); client A is this machine, client B runs inside h2. Both
reach h1 across the test bridge (10.213.x.0/24), through the relay, with strict host keys.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import keys, netns
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import HOOKS, STATE, active, install_agent
from tests.test_switch_hosts import MODELS, config_text

PY = sys.executable
SOCKET = f"{STATE}/agent.sock"
B_KEY, B_KNOWN, B_HOSTS = "/etc/orchestrator-test-key", "/etc/orchestrator-test-known-hosts", "/etc/orch-hosts.toml"

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def net_hosts(netns_pair: HostSet) -> HostSet:
    """The session's pair of hosts in network namespaces (tests/hosts/fixtures.py)."""
    return netns_pair


def hosts_toml(box: Host, key: str, known: str) -> str:
    return (
        f'[box]\nurl = "ssh://root@{box.address}:{box.port}"\nkey = "{key}"\nknown_hosts = "{known}"\n'
        f'python = "{PY}"\nsocket = "{SOCKET}"\n'
    )


@pytest.fixture
def box(net_hosts: HostSet, tmp_path: Path) -> Iterator[Host]:
    """h1 runs the agent; h2 holds a client key and a hosts file naming h1 as `box`."""
    h1, h2 = net_hosts.hosts
    h1.run(f"rm -rf {STATE}")
    install_agent(h1, config_text(h1, Path(STATE), MODELS, transport="local"), tmp_path)
    h2.write_file(B_KEY, Path(h1.key_path).read_text(), mode=0o600)
    h2.write_file(B_KNOWN, Path(h1.known_hosts_path).read_text())
    h2.write_file(B_HOSTS, hosts_toml(h1, B_KEY, B_KNOWN))
    (tmp_path / "hosts.toml").write_text(hosts_toml(h1, str(h1.key_path), str(h1.known_hosts_path)))
    os.environ["ORCHESTRATOR_HOSTS_FILE"] = str(tmp_path / "hosts.toml")
    try:
        yield h1
    finally:
        del os.environ["ORCHESTRATOR_HOSTS_FILE"]
        for h in net_hosts.hosts:
            h.reset()


def client_a(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on this machine, through the relay on the box."""
    return subprocess.run(
        [PY, "-m", "orchestrator", "--host", "box", *args], capture_output=True, text=True, timeout=120, check=False
    )


def client_b(h2: Host, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI inside h2 (another machine on the network), through the relay on the box."""
    line = shlex.join([PY, "-m", "orchestrator", "--host", "box", *args])
    return h2.run(f"ORCHESTRATOR_HOSTS_FILE={B_HOSTS} {line}", check=False)


def history(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def paused(box: Host) -> bool:
    return box.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0


def hold_at(box: Host, phase: str) -> None:
    box.write_file(f"{HOOKS}/pause-at", phase)


def release(box: Host) -> None:
    box.run(f"rm -f {HOOKS}/pause-at {HOOKS}/paused")


def machine_address(box: Host) -> str:
    """This machine's address on the test bridge, as the box sees it."""
    first = int(box.address.split(".")[2])
    return netns.address(first, 1)


def test_switch_through_the_relay_records_the_ssh_login(net_hosts: HostSet, box: Host) -> None:
    """A switch from this machine goes through the box's agent; the box records root@<this machine>."""
    done = client_a("switch", "alpha", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["outcome"] == "active" and out["host"] == box.name
    assert out["trigger"] == f"root@{machine_address(box)}"
    assert active(box, "vllm-alpha.service") == "active"
    local = json.loads(
        box.run(
            shlex.join(
                [
                    PY,
                    "-m",
                    "orchestrator",
                    "history",
                    "--json",
                    "--local",
                    "--config",
                    "/etc/orchestrator-agent-test.toml",
                ]
            )
        ).stdout
    )
    assert [h["revision"] for h in local] == [1]


def test_a_forged_ssh_connection_does_not_change_the_recorded_address(
    net_hosts: HostSet, box: Host, tmp_path: Path
) -> None:
    """A relay with SSH_CONNECTION forged to 6.6.6.6 is recorded at sshd's own connection's address."""
    forging = "/usr/local/bin/forging-python"
    box.write_file(
        forging, f'#!/bin/sh\nexport SSH_CONNECTION="6.6.6.6 4242 {box.address} 22"\nexec {PY} "$@"\n', mode=0o755
    )
    hosts = tmp_path / "forging-hosts.toml"
    hosts.write_text(hosts_toml(box, str(box.key_path), str(box.known_hosts_path)).replace(f'"{PY}"', f'"{forging}"'))
    done = subprocess.run(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "alpha", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ORCHESTRATOR_HOSTS_FILE": str(hosts)},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trigger"] == f"root@{machine_address(box)}"
    shown = client_a("history", "--json")
    assert "6.6.6.6" not in shown.stdout and history(shown)[0]["trigger"] == f"root@{machine_address(box)}"


def test_two_clients_at_once_one_is_refused_naming_the_running_switch(net_hosts: HostSet, box: Host) -> None:
    """A's switch holds the box; B's switch is refused naming A's deployment and A; both see one history."""
    h2 = net_hosts.hosts[1]
    assert client_a("switch", "alpha").returncode == 0
    hold_at(box, "stopping")
    first = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "beta"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: paused(box), bool, timeout=60, what="A's switch to hold before stopping")
        refused = client_b(h2, "switch", "gamma")
    finally:
        release(box)
        _out, err = first.communicate(timeout=120)
    assert refused.returncode == 5, refused.stderr
    assert "busy" in refused.stderr and "beta" in refused.stderr
    assert f"root@{machine_address(box)}" in refused.stderr
    assert first.returncode == 0, err
    seen_a, seen_b = history(client_a("history", "--json")), history(client_b(h2, "history", "--json"))
    assert seen_a == seen_b
    assert [(h["model"], h["outcome"]) for h in seen_a] == [("beta", "active"), ("alpha", "active")]
    assert active(box, "vllm-beta.service") == "active" and active(box, "vllm-gamma.service") != "active"


def test_switch_of_two_models_over_host_is_checked_as_locally_before_anything_stops(box: Host) -> None:
    """--host switch A B is refused (exit 2) by the box's catalog as it is locally (this box has no front
    proxy: overlapping or disjoint GPUs alike) and what served still serves; no switch was sent."""
    assert client_a("switch", "alpha").returncode == 0
    overlapping, disjoint = client_a("switch", "beta", "alpha"), client_a("switch", "gamma", "alpha")
    assert (overlapping.returncode, disjoint.returncode) == (2, 2), overlapping.stderr + disjoint.stderr
    assert "needs the front proxy" in overlapping.stderr and "needs the front proxy" in disjoint.stderr
    assert [h["model"] for h in history(client_a("history", "--json"))] == ["alpha"]
    assert active(box, "vllm-alpha.service") == "active"


def test_dry_run_over_host_says_what_the_box_would_do(box: Host) -> None:
    """switch --dry-run with --host reads the box's records: stop-start without a proxy, naming what stops."""
    assert client_a("switch", "alpha").returncode == 0
    out = client_a("switch", "beta", "--dry-run", "--json")
    assert out.returncode == 0, out.stderr
    [plan] = json.loads(out.stdout)
    assert (plan["model"], plan["mode"], plan["displaced"]) == ("beta", "stop_start", ["alpha"])
    assert [h["model"] for h in history(client_a("history", "--json"))] == ["alpha"]


def test_models_plan_and_render_over_host_read_the_boxs_deploy_toml(box: Host, tmp_path: Path) -> None:
    """--host models/plan/render use the box's catalog (alpha...), not ./deploy.toml here (the seeds'
    models); plan's switch line comes from the box's records."""
    listed = client_a("models", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {m["name"] for m in json.loads(listed.stdout)} == set(MODELS)
    minimax = Path(__file__).parent / "fixtures/configs/MiniMaxAI__MiniMax-M2.5.json"
    assert client_a("switch", "alpha").returncode == 0
    planned = client_a("plan", "beta", "--model-config", str(minimax), "--json")
    assert planned.returncode == 0, planned.stderr
    out = json.loads(planned.stdout)
    assert (out["name"], out["switch"]["mode"], out["switch"]["displaced"]) == ("beta", "stop_start", ["alpha"])
    rendered = client_a("render", "gamma", "--out", str(tmp_path / "units"))
    assert rendered.returncode == 0, rendered.stderr
    assert f"{box.address}" in (tmp_path / "units/vllm-gamma.service").read_text()


def test_agent_killed_mid_switch_over_host_says_it_resumes_and_how_to_follow(box: Host) -> None:
    """kill -9 of the agent while a --host switch holds: the CLI says the agent resumes it and names
    `--host box status --follow` (it said "relay exited 0"); the restarted agent finishes the switch."""
    assert client_a("switch", "alpha").returncode == 0
    hold_at(box, "stopping")
    first = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "beta"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: paused(box), bool, timeout=60, what="the switch to hold before stopping")
        box.run(f"rm -f {HOOKS}/pause-at && systemctl kill -s SIGKILL orchestrator-agent.service")
        _out, err = first.communicate(timeout=120)
    finally:
        release(box)
    assert first.returncode == 6, err
    assert "resumes the switch when it starts again" in err and "`orchestrator --host box status --follow`" in err
    wait_for(
        lambda: client_a("history", "--json"),
        lambda r: r.returncode == 0 and json.loads(r.stdout)[0]["outcome"] in ("active", "rolled_back"),
        timeout=90,
        interval=1.0,
        what="the restarted agent to end the switch",
    )
    assert history(client_a("history", "--json"))[0]["model"] == "beta"


def test_rollback_from_another_client_returns_to_what_served_before(net_hosts: HostSet, box: Host) -> None:
    """A switches alpha -> beta; B (another machine) rolls back: alpha serves again, B is recorded."""
    h2 = net_hosts.hosts[1]
    assert client_a("switch", "alpha").returncode == 0
    assert client_a("switch", "beta").returncode == 0
    back = client_b(h2, "rollback", "--json")
    assert back.returncode == 0, back.stderr
    result = json.loads(back.stdout)
    assert (result["model"], result["outcome"]) == ("alpha", "active")
    assert result["trigger"] == f"rollback by root@{h2.address}:to-1"
    assert active(box, "vllm-alpha.service") == "active" and active(box, "vllm-beta.service") != "active"


def test_cut_connection_mid_switch_completes_and_another_client_follows_it(net_hosts: HostSet, box: Host) -> None:
    """Client A is killed mid-switch (its SSH transport dies): the box finishes; B's status --follow sees the end."""
    h2 = net_hosts.hosts[1]
    assert client_a("switch", "alpha").returncode == 0
    hold_at(box, "starting")
    first = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "beta"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: paused(box), bool, timeout=60, what="A's switch to hold before starting")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    follow = shlex.join([PY, "-m", "orchestrator", "--host", "box", "status", "--follow"])
    h2.run(f"ORCHESTRATOR_HOSTS_FILE={B_HOSTS} nohup {follow} > /tmp/follow.log 2>&1 & echo $! > /tmp/follow.pid")
    wait_for(
        lambda: h2.run("cat /tmp/follow.log").stdout,
        lambda log: "following switch beta" in log,
        timeout=60,
        what="B's status --follow to attach",
    )
    release(box)
    wait_for(
        lambda: h2.run("kill -0 $(cat /tmp/follow.pid)", check=False).returncode,
        lambda rc: rc != 0,
        timeout=90,
        what="B's status --follow to end",
    )
    log = h2.run("cat /tmp/follow.log").stdout
    assert "revision 2 in phase starting" in log and "#2 beta: active" in log, log
    assert "h1: beta (revision 2" in log, log
    assert active(box, "vllm-beta.service") == "active" and active(box, "vllm-alpha.service") != "active"


@pytest.fixture
def bare(net_hosts: HostSet, tmp_path: Path) -> Iterator[tuple[Host, Path]]:
    """h1 with no agent; a hosts file whose `box` is h1 (the test may swap its known_hosts)."""
    h1 = net_hosts.hosts[0]
    h1.run(f"rm -rf {STATE}")
    try:
        yield h1, tmp_path / "hosts.toml"
    finally:
        h1.reset()


def run_with(hosts_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "orchestrator", "--host", "box", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "ORCHESTRATOR_HOSTS_FILE": str(hosts_file)},
    )


def nothing_changed(box: Host) -> bool:
    units = box.run("ls /etc/systemd/system | grep -c '^vllm-' || true").stdout.strip()
    return units == "0" and box.run(["test", "-e", STATE], check=False).returncode != 0


def test_box_without_agent_exits_6_naming_the_host(bare: tuple[Host, Path]) -> None:
    """The relay finds no agent socket: exit 6, one line naming the host and the socket; nothing changed."""
    box, hosts_file = bare
    hosts_file.write_text(hosts_toml(box, str(box.key_path), str(box.known_hosts_path)))
    result = run_with(hosts_file, "switch", "alpha")
    assert result.returncode == 6, result.stderr
    assert result.stderr.strip() == f"error: host box: agent socket {SOCKET}: no agent is running there"
    assert nothing_changed(box)


def test_wrong_host_key_exits_4_and_nothing_is_sent(net_hosts: HostSet, bare: tuple[Host, Path]) -> None:
    """known_hosts holds another key for the box's address: exit 4 naming the mismatch; nothing changed."""
    box, hosts_file = bare
    other = net_hosts.hosts[1]
    forged = hosts_file.with_name("known_hosts")
    other_pub = other.host_key_path.with_name(other.host_key_path.name + ".pub").read_text()
    forged.write_text(keys.known_hosts_line(box.address, box.port, other_pub))
    hosts_file.write_text(hosts_toml(box, str(box.key_path), str(forged)))
    result = run_with(hosts_file, "switch", "alpha")
    assert result.returncode == 4, result.stderr
    assert "host box" in result.stderr and "host key mismatch" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert nothing_changed(box)


def test_unknown_host_key_is_refused_not_added(bare: tuple[Host, Path]) -> None:
    """An empty known_hosts: exit 4 ('not found in known_hosts'), and the file stays empty."""
    box, hosts_file = bare
    empty = hosts_file.with_name("known_hosts")
    empty.write_text("")
    hosts_file.write_text(hosts_toml(box, str(box.key_path), str(empty)))
    result = run_with(hosts_file, "history")
    assert result.returncode == 4 and "not found in known_hosts" in result.stderr, result.stderr
    assert empty.read_text() == ""


AGENT_CONFIG = "/etc/orchestrator-agent-test.toml"


def test_config_push_of_an_invalid_file_changes_nothing(box: Host, tmp_path: Path) -> None:
    """An unknown model key in a pushed file: exit 2 naming file and key; the box's file and revisions stay."""
    before = json.loads(client_a("config", "show", "--json").stdout)
    bad = tmp_path / "deploy.toml"
    bad.write_text(before["text"] + '[models.delta]\nrepo = "test/delta"\ntensor_paralel = 4\n')
    result = client_a("config", "push", str(bad))
    assert result.returncode == 2, result.stderr
    assert "deploy.toml" in result.stderr and "tensor_paralel" in result.stderr and ".push-" not in result.stderr
    after = json.loads(client_a("config", "show", "--json").stdout)
    assert (after["revision"], after["sha256"]) == (before["revision"], before["sha256"])
    assert box.run(["test", "-e", f"{AGENT_CONFIG}.prev"], check=False).returncode != 0


def test_config_push_is_recorded_reloaded_and_linked_to_deployments(box: Host, tmp_path: Path) -> None:
    """A valid push: new revision, previous file kept, the new model switchable at once, its deployment linked."""
    before = json.loads(client_a("config", "show", "--json").stdout)
    new = tmp_path / "deploy.toml"
    new.write_text(
        before["text"] + '[models.delta]\nrepo = "test/delta"\nsource = "none"\ntensor_parallel = 4\n'
        'gpus = [0, 1, 2, 3]\nport = 8108\nargs = ["--load-time", "0.3"]\n'
    )
    assert client_a("config", "diff", str(new)).returncode == 1
    pushed = client_a("config", "push", str(new), "--json")
    assert pushed.returncode == 0, pushed.stderr
    result = json.loads(pushed.stdout)
    assert result["changed"] and result["revision"] == before["revision"] + 1
    assert box.run(["cat", f"{AGENT_CONFIG}.prev"]).stdout == before["text"]
    assert client_a("config", "diff", str(new)).returncode == 0
    switched = client_a("switch", "delta", "--json")
    assert switched.returncode == 0, switched.stderr
    newest = history(client_a("history", "--json"))[0]
    assert (newest["model"], newest["outcome"], newest["config_revision"]) == ("delta", "active", result["revision"])


def test_config_push_during_a_switch_is_refused_and_says_so(box: Host, tmp_path: Path) -> None:
    """A push while a switch runs: exit 5, the message says it was refused (not that it waits), and
    nothing changed; the switch ends active."""
    before = json.loads(client_a("config", "show", "--json").stdout)
    new = tmp_path / "deploy.toml"
    new.write_text(before["text"] + "# a comment\n")
    hold_at(box, "stopping")
    first = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "switch", "alpha"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: paused(box), bool, timeout=60, what="the switch to hold before stopping")
        pushed = client_a("config", "push", str(new))
    finally:
        release(box)
        _out, err = first.communicate(timeout=120)
    assert pushed.returncode == 5, pushed.stderr
    assert "refused" in pushed.stderr and "switch on h1" in pushed.stderr and "waits" not in pushed.stderr
    assert json.loads(client_a("config", "show", "--json").stdout)["revision"] == before["revision"]
    assert first.returncode == 0, err


def agentless(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A controller with no agent of its own on the box: the CLI in-process, ssh transport."""
    return subprocess.run(
        [PY, "-m", "orchestrator", *args, "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_agentless_controller_refuses_a_box_whose_agent_runs(box: Host, tmp_path: Path) -> None:
    """In-process over SSH against a box with a running agent: exit 5 naming the agent; nothing changed."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(box, tmp_path / "state", MODELS))
    result = agentless(cfg, "switch", "alpha")
    assert result.returncode == 5, result.stderr
    assert "orchestrator-agent.service" in result.stderr and f"--host ssh://root@{box.address}:22" in result.stderr
    assert active(box, "vllm-alpha.service") != "active"


def test_two_agentless_controllers_cannot_interleave(bare: tuple[Host, Path], tmp_path: Path) -> None:
    """While one controller holds the box's lock, another's switch is refused naming the holder; then it works."""
    from orchestrator import settings
    from orchestrator.client.box_lock import box_lock

    box, _ = bare
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(config_text(box, tmp_path / "state", MODELS))
    with box_lock(settings.load(cfg).hosts[box.name]):
        refused = agentless(cfg, "switch", "alpha")
    assert refused.returncode == 5, refused.stderr
    assert "another controller holds /var/lib/orchestrator/agentless.lock" in refused.stderr
    assert f"root from {machine_address(box)}" in refused.stderr
    assert active(box, "vllm-alpha.service") != "active"
    done = agentless(cfg, "switch", "alpha", "--json")
    assert done.returncode == 0, done.stderr
    assert active(box, "vllm-alpha.service") == "active"


def test_doctor_through_the_boxs_agent(box: Host) -> None:
    """`--host box doctor --json`: the box's agent probes its own host (systemd over D-Bus, the engine run as
    its user in a transient unit) and answers the report; the venv's python has no vLLM, so exit 1."""
    result = client_a("doctor", "--json")
    report = json.loads(result.stdout)
    checks = {c["check"]: c for c in report["checks"]}
    assert result.returncode == 1 and report["host"] == box.name and report["ok"] is False
    assert checks["systemd"]["status"] == "ok" and checks["user root"]["status"] == "ok"
    assert checks["engine alpha"]["status"] == "fail" and "No module named 'vllm'" in checks["engine alpha"]["detail"]
