"""Fleet rollouts over 4 test hosts, each in its own network namespace with its own agent and the
stand-in engine; the controller is this machine's CLI, reaching every agent through its relay.

Every box starts serving alpha; the rollout switches the group model beta. A box whose own
deploy.toml gives beta a failing engine is a box whose switch fails there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.builders.agent import CONFIG, PY, REPO
from tests.builders.rollout import SOCKET, install
from tests.builders.switch import MODELS
from tests.hosts import keys, netns
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet
from tests.hosts.wait import wait_for
from tests.hubstub import HubStub, StubRepo, sharded_model
from tests.test_agent_hosts import active

PEER_KEY, PEER_KNOWN = "/etc/orchestrator-test-key", "/etc/orchestrator-test-known-hosts"
SHA = "b" * 40
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
BROKEN = {"args": ["--health-ok-but-completions-fail"]}

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def fleet(netns_fleet: HostSet) -> HostSet:
    """The session's four hosts in network namespaces (shared with the other modules of four boxes)."""
    return netns_fleet


def box_models(broken: bool = False, **beta: Any) -> dict[str, dict[str, Any]]:
    return {"alpha": MODELS["alpha"], "beta": {**MODELS["beta"], **(BROKEN if broken else {}), **beta}}


def controller_config(hostset: HostSet, state: Path, *, groups: str | None = None, beta: str = "") -> str:
    lines = [f'state_dir = "{state}"']
    for h in hostset.hosts:
        lines += [
            f"[hosts.{h.name}]",
            f'address = "{h.address}"',
            f"ssh_port = {h.port}",
            f'ssh_key = "{hostset.key_path}"',
            f'known_hosts = "{hostset.known_hosts_path}"',
            f'python = "{PY}"',
            f'agent_socket = "{SOCKET}"',
            "gpus = 8",
        ]
    names = ", ".join(f'"{h.name}"' for h in hostset.hosts)
    lines.append(
        groups
        or f"[groups.inference]\nhosts = [{names}]\ncanary = 1\nbatch = 2\n"
        f'peer_key = "{PEER_KEY}"\npeer_known_hosts = "{PEER_KNOWN}"'
    )
    lines += [
        "[models.beta]",
        'group = "inference"',
        'repo = "test/beta"',
        "gpus = [0, 1, 2, 3]",
        "tensor_parallel = 4",
        "port = 8102",
        beta or 'source = "none"',
    ]
    return "\n".join(lines) + "\n"


def on_each(hosts: list[Host], step: Callable[[Host], None]) -> None:
    """step on every box at once (each box is its own machine; one at a time only adds up waits)."""
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        for fut in [pool.submit(step, h) for h in hosts]:
            fut.result()


def _stop_and_reset(host: Host) -> None:
    host.run("systemctl stop orchestrator-agent.service", check=False)
    host.reset()


@pytest.fixture
def boxes(fleet: HostSet) -> Iterator[list[Host]]:
    try:
        yield fleet.hosts
    finally:
        on_each(fleet.hosts, _stop_and_reset)


def start_all(hosts: list[Host], broken: set[str] = frozenset(), **beta: Any) -> None:  # type: ignore[assignment]
    def start(h: Host) -> None:
        install(h, box_models(h.name in broken, **beta))
        assert box_cli(h, "switch", "alpha").returncode == 0, h.name

    on_each(hosts, start)


def box_cli(host: Host, *args: str) -> subprocess.CompletedProcess[str]:
    return host.run(f"{PY} -m orchestrator {' '.join(args)} --config {CONFIG}", check=False)


def box_history(host: Host) -> list[dict[str, Any]]:
    return list(json.loads(box_cli(host, "history", "--json").stdout))


def ctl(cfg: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "orchestrator", *args, "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )


def beta_runs(host: Host) -> list[dict[str, Any]]:
    return [d for d in box_history(host) if d["model"] == "beta"]


def write_config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(text)
    return cfg


def states(summary: dict[str, Any]) -> dict[str, str]:
    return {h["host"]: h["state"] for h in summary["hosts"]}


def test_canary_then_batches_succeeds_and_history_shows_the_order(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """4 hosts, canary 1, batch 2: every box serves beta; the group history shows h1, then h2+h3, then h4."""
    start_all(boxes)
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    done = ctl(cfg, "rollout", "beta", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("runs in this CLI (no controller") == 1, done.stderr  # said once
    summary = json.loads(done.stdout)
    assert summary["rollout"]["status"] == "succeeded"
    assert [(h["host"], h["batch"], h["state"]) for h in summary["hosts"]] == [
        ("h1", 0, "switched"),
        ("h2", 1, "switched"),
        ("h3", 1, "switched"),
        ("h4", 2, "switched"),
    ]
    assert all(
        active(h, "vllm-beta.service") == "active" and active(h, "vllm-alpha.service") != "active" for h in boxes
    )
    hist = ctl(cfg, "history", "--group", "inference", "--json")
    assert hist.returncode == 0, hist.stderr
    beta = sorted((d for d in json.loads(hist.stdout) if d["model"] == "beta"), key=lambda d: d["created_at"])
    assert [d["group_host"] for d in beta][::3] == ["h1", "h4"]
    by_host = {d["group_host"]: d for d in beta}
    assert by_host["h1"]["ended_at"] <= min(by_host["h2"]["created_at"], by_host["h3"]["created_at"])
    assert max(by_host["h2"]["ended_at"], by_host["h3"]["ended_at"]) <= by_host["h4"]["created_at"]
    status = ctl(cfg, "status", "--group", "inference", "--json")
    assert status.returncode == 0, status.stderr
    revisions = json.loads(status.stdout)["revisions"]
    assert list(revisions.values()) == [["h1", "h2", "h3", "h4"]] and next(iter(revisions)) == "beta@main"


def test_failed_canary_rolls_back_and_no_other_host_stops(fleet: HostSet, boxes: list[Host], tmp_path: Path) -> None:
    """The canary's beta fails its health check: its agent rolls it back; h2-h4 never stop alpha; exit 1."""
    start_all(boxes, broken={"h1"})
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    done = ctl(cfg, "rollout", "beta", "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["rollout"]["status"] == "failed" and "canary h1 failed" in summary["rollout"]["reason"]
    assert states(summary) == {"h1": "failed", "h2": "pending", "h3": "pending", "h4": "pending"}
    assert summary["hosts"][0]["outcome"] == "rolled_back"
    assert all(active(h, "vllm-alpha.service") == "active" for h in boxes)
    for h in boxes[1:]:
        assert [(d["model"], d["outcome"]) for d in box_history(h)] == [("alpha", "active")]


def test_failure_in_batch_2_stops_and_rollback_all_restores_the_rest(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """h3 fails in batch 2: it rolls back, h4 is never touched, --rollback-all returns h1 and h2 to alpha."""
    start_all(boxes, broken={"h3"})
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    done = ctl(cfg, "rollout", "beta", "--rollback-all", "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert states(summary) == {"h1": "reverted", "h2": "reverted", "h3": "failed", "h4": "pending"}
    assert "h3" in summary["rollout"]["reason"]
    assert all(
        active(h, "vllm-alpha.service") == "active" and active(h, "vllm-beta.service") != "active" for h in boxes
    )
    assert [(d["model"], d["outcome"]) for d in box_history(boxes[3])] == [("alpha", "active")]
    assert [d["outcome"] for d in beta_runs(boxes[2])] == ["rolled_back"]
    status = json.loads(ctl(cfg, "rollout", "status", "--json").stdout)
    assert status["rollout"]["status"] == "failed" and states(status) == states(summary)


def paused_rollout(cfg: Path, hooks: Path, after_batch: int) -> subprocess.Popen[str]:
    hooks.mkdir(exist_ok=True)
    (hooks / "rollout-pause-after").write_text(str(after_batch))
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "tests.rollout_with_hooks",
            "--pause-dir",
            str(hooks),
            "rollout",
            "beta",
            "--config",
            str(cfg),
            "--json",
        ],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    wait_for(
        lambda: (hooks / "rollout-paused").exists() or proc.poll() is not None,
        bool,
        timeout=180,
        what=f"the controller to hold after batch {after_batch}",
    )
    assert proc.poll() is None, proc.communicate()
    return proc


def test_controller_killed_between_batches_resume_finishes_without_switching_twice(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """SIGKILL the controller after the canary: `rollout status` says interrupted; `rollout resume`
    finishes; each box has one beta deployment."""
    start_all(boxes)
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    proc = paused_rollout(cfg, tmp_path / "hooks", 0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert active(boxes[0], "vllm-beta.service") == "active" and active(boxes[1], "vllm-beta.service") != "active"
    shown = ctl(cfg, "rollout", "status").stdout  # the controller is gone: not "running"
    assert ": interrupted: its controller (pid " in shown and "`orchestrator rollout resume`" in shown, shown
    (tmp_path / "hooks" / "rollout-pause-after").unlink()
    resumed = ctl(cfg, "rollout", "resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["rollout"]["status"] == "succeeded" and set(states(summary).values()) == {"switched"}
    for h in boxes:
        assert [d["outcome"] for d in beta_runs(h)] == ["active"], h.name


def test_rollout_while_another_runs_on_one_of_its_hosts_is_refused(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """A rollout holds h1-h4 (paused after its canary): another group's rollout sharing h2 exits 5, nothing stops."""
    start_all(boxes)
    names = ", ".join(f'"{h.name}"' for h in boxes)
    groups = (
        f'[groups.inference]\nhosts = [{names}]\ncanary = 1\nbatch = 2\n[groups.edge]\nhosts = ["h2"]\ncanary = 0\n'
    )
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl", groups=groups))
    proc = paused_rollout(cfg, tmp_path / "hooks", 0)
    try:
        second = ctl(cfg, "rollout", "beta", "--group", "edge")
    finally:
        (tmp_path / "hooks" / "rollout-pause-after").unlink()
        _out, err = proc.communicate(timeout=300)
    assert second.returncode == 5, second.stderr
    assert "rollout #1 (beta on group inference, started by " in second.stderr
    # "is still running on h2" where the first CLI's command line names orchestrator (process_alive); this
    # harness's (python -m tests.rollout_with_hooks) does not, so it may read "has not finished on h2"
    assert re.search(r"\(this CLI\)\) (is still running|has not finished) on h2", second.stderr), second.stderr
    assert proc.returncode == 0, err
    assert [d["outcome"] for d in beta_runs(boxes[1])] == ["active"]


def test_unknown_group_exits_2_and_nothing_is_recorded(fleet: HostSet, tmp_path: Path) -> None:
    """--group that deploy.toml does not define: exit 2, one line naming it and the known groups."""
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    result = ctl(cfg, "rollout", "beta", "--group", "training")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: unknown group 'training' (known: inference)"
    assert not (tmp_path / "ctl" / "rollouts.db").exists() or "rollout #" not in ctl(cfg, "rollout", "status").stdout


def test_host_without_agent_or_unreachable_is_refused_before_anything_stops(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """h3 has no agent and h4's link is down: exit 6 naming both, before any box stops alpha."""
    start_all(boxes)
    boxes[2].run("systemctl stop orchestrator-agent.service")
    slot = int(boxes[3].address.rsplit(".", 1)[1])
    cfg = write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))
    netns.link_down(slot)
    try:
        result = ctl(cfg, "rollout", "beta")
    finally:
        netns.link_up(slot)
    assert result.returncode in (4, 6), result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: rollout refused before anything stopped") and len(line.splitlines()) == 1
    assert "h3: host h3: agent socket" in line and "h4: host h4" in line
    assert all(active(h, "vllm-alpha.service") == "active" for h in boxes[:2])
    for h in boxes[:2]:
        assert beta_runs(h) == []


def test_one_hub_download_for_the_group_the_others_copy_from_a_peer(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """beta from the hub: the seed pulls each shard once, h2-h4 rsync from it; all four switch."""
    first = int(boxes[0].address.split(".")[2])
    files = {
        **sharded_model(SHARDS, 50_000),
        "config.json": json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 256,
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "num_hidden_layers": 2,
                "intermediate_size": 512,
                "vocab_size": 1000,
                "max_position_embeddings": 256,
                "torch_dtype": "float32",
            }
        ).encode(),
    }
    with HubStub(address=netns.address(first, 1)) as hub:
        hub.add(StubRepo.of("test/beta", files, sha=SHA))

        def start(h: Host) -> None:
            h.write_file(PEER_KEY, Path(fleet.key_path).read_text(), mode=0o600)
            h.write_file(PEER_KNOWN, Path(fleet.known_hosts_path).read_text())
            install(h, box_models(source="hub", revision=SHA), env={"HF_ENDPOINT": hub.url})
            assert box_cli(h, "switch", "alpha").returncode == 0, h.name

        on_each(boxes, start)
        cfg = write_config(
            tmp_path, controller_config(fleet, tmp_path / "ctl", beta=f'source = "hub"\nrevision = "{SHA}"')
        )
        done = ctl(cfg, "rollout", "beta", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        # each file's body went out of the hub exactly once: one model's worth of egress, not four
        assert hub.body_bytes == {name: len(data) for name, data in files.items()}
    for h in boxes:
        staged = h.run(f"cat /models/test--beta/{SHA}/{SHARDS[1]} | sha256sum").stdout
        assert staged == boxes[0].run(f"cat /models/test--beta/{SHA}/{SHARDS[1]} | sha256sum").stdout
        assert active(h, "vllm-beta.service") == "active"


# -- through a controller: the rollout is a job of the controller's agent -------------------------------
# The controller's agent runs on this machine with its own deploy.toml (the hosts with its SSH key);
# the clients are CLIs whose deploy.toml has a key no box authorizes, reaching the controller's socket.


class Controller:
    def __init__(self, fleet: HostSet, tmp_path: Path, *, bad_key_on: str | None = None) -> None:
        self.dir, self.hooks = tmp_path / "ctl", tmp_path / "hooks"
        self.hooks.mkdir(exist_ok=True)
        self.socket = str(self.dir / "agent.sock")
        text = controller_config(fleet, self.dir)
        stranger = tmp_path / "stranger_ed25519"
        keys.generate_ed25519(stranger, "not-authorized-anywhere")
        if bad_key_on is not None:  # that one host does not authorize the controller's key
            head, _, tail = text.partition(f"[hosts.{bad_key_on}]")
            text = head + f"[hosts.{bad_key_on}]" + tail.replace(str(fleet.key_path), str(stranger), 1)
        self.cfg = write_config(tmp_path, text)
        self.client_cfg = tmp_path / "laptop.toml"  # the laptop's key is authorized nowhere
        self.client_cfg.write_text(
            controller_config(fleet, tmp_path / "laptop").replace(str(fleet.key_path), str(stranger))
        )
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = tmp_path / "controller.log"
        self.log = self.log_path.open("a")

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                PY,
                "-m",
                "tests.controller_with_hooks",
                "--pause-dir",
                str(self.hooks),
                "agent",
                "--config",
                str(self.cfg),
                "--metrics-port",
                "0",
            ],
            cwd=REPO,
            text=True,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        proc = self.proc
        wait_for(lambda: self.answers() or proc.poll() is not None, timeout=60, what="the controller's agent to answer")
        assert proc.poll() is None, self.log_path.read_text()

    def answers(self) -> bool:
        from orchestrator.client.backends import AgentClient
        from orchestrator.contract.ops import PING
        from orchestrator.errors import OrchestratorError

        try:
            AgentClient(self.socket).call(PING, {})
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
            self.proc.wait(timeout=60)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return ctl(self.client_cfg, *args, env={"ORCHESTRATOR_SOCKET": self.socket})

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [PY, "-m", "orchestrator", *args, "--config", str(self.client_cfg)],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "ORCHESTRATOR_SOCKET": self.socket},
        )

    def hold_after(self, batch: int) -> None:
        (self.hooks / "rollout-paused").unlink(missing_ok=True)
        (self.hooks / "rollout-pause-after").write_text(str(batch))

    def await_held(self) -> None:
        wait_for(
            lambda: (self.hooks / "rollout-paused").exists(), timeout=180, what="the controller to hold after its batch"
        )

    def release(self) -> None:
        (self.hooks / "rollout-pause-after").unlink(missing_ok=True)


@pytest.fixture
def controller(fleet: HostSet, boxes: list[Host], tmp_path: Path) -> Iterator[Controller]:
    ctl_ = Controller(fleet, tmp_path)
    start_all(boxes)
    ctl_.start()
    try:
        yield ctl_
    finally:
        ctl_.release()
        ctl_.stop()


def test_through_the_controller_the_rollout_survives_the_cli_and_a_second_client_sees_it_end(
    controller: Controller, boxes: list[Host]
) -> None:
    """The CLI that started it is SIGKILLed after the canary: the rollout goes on in the controller; a
    second client's `rollout status` shows every host and `status --follow` sees it succeed, each box
    switched once (through the controller's SSH key: the clients' key is authorized nowhere)."""
    controller.hold_after(0)
    first = controller.popen("rollout", "beta")
    controller.await_held()
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    shown = json.loads(controller.cli("rollout", "status", "--json").stdout)
    assert shown["rollout"]["status"] == "running" and shown["rollout"]["started_by"]
    assert states(shown) == {"h1": "switched", "h2": "pending", "h3": "pending", "h4": "pending"}
    controller.release()
    followed = controller.cli("rollout", "status", "--follow", "--json")
    assert followed.returncode == 0, followed.stderr
    summary = json.loads(followed.stdout)
    assert summary["rollout"]["status"] == "succeeded" and set(states(summary).values()) == {"switched"}
    for h in boxes:
        assert [d["outcome"] for d in beta_runs(h)] == ["active"], h.name


def test_abort_from_a_second_client_stops_the_next_batch_and_a_second_rollout_is_refused(
    controller: Controller, boxes: list[Host]
) -> None:
    """Held after the canary: another rollout of the group exits 5 naming #1 and who started it; abort
    from another client ends it aborted with h2-h4 never switched."""
    controller.hold_after(0)
    first = controller.popen("rollout", "beta", "--json")
    controller.await_held()
    second = controller.cli("rollout", "beta")
    assert second.returncode == 5, second.stderr
    assert "rollout #1 (beta on group inference, started by " in second.stderr, second.stderr
    aborted = controller.cli("rollout", "abort")
    assert aborted.returncode == 0 and "stops after its running batch" in aborted.stdout, aborted.stderr
    controller.release()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 1, err
    summary = json.loads(out)
    assert summary["rollout"]["status"] == "aborted"
    assert states(summary) == {"h1": "switched", "h2": "pending", "h3": "pending", "h4": "pending"}
    for h in boxes[1:]:
        assert beta_runs(h) == [], h.name


def test_the_controllers_agent_killed_between_batches_resumes_on_restart_switching_each_host_once(
    controller: Controller, boxes: list[Host]
) -> None:
    """SIGKILL the controller's agent after the canary: started again, it resumes the rollout by itself;
    it succeeds and every box has exactly one beta deployment."""
    controller.hold_after(0)
    first = controller.popen("rollout", "beta")
    controller.await_held()
    controller.kill()
    _out, err = first.communicate(timeout=60)
    assert first.returncode != 0 and "status --follow" in err, err  # it lost the controller: detached
    controller.release()
    controller.start()
    followed = controller.cli("rollout", "status", "--follow", "--json")
    assert followed.returncode == 0, followed.stderr
    summary = json.loads(followed.stdout)
    assert summary["rollout"]["status"] == "succeeded" and set(states(summary).values()) == {"switched"}
    for h in boxes:
        assert [d["outcome"] for d in beta_runs(h)] == ["active"], h.name


def test_a_host_that_does_not_authorize_the_controllers_key_fails_preflight_naming_it(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """h3 does not authorize the controller's key: the rollout is refused naming h3; no box stops alpha."""
    start_all(boxes)
    ctl_ = Controller(fleet, tmp_path, bad_key_on="h3")
    ctl_.start()
    try:
        result = ctl_.cli("rollout", "beta")
    finally:
        ctl_.stop()
    assert result.returncode == 4, result.stderr
    assert "rollout refused before anything stopped" in result.stderr and "h3: host h3" in result.stderr
    for h in boxes:
        assert active(h, "vllm-alpha.service") == "active" and beta_runs(h) == [], h.name


def _kill_ssh_session_of_the_relay(host: Host) -> None:
    """Kill (by pid) the box's sshd session that runs the controller's relay: its SSH connection dies."""
    relay = host.run("pgrep -f 'orchestrator[.]agent[.]relay'").stdout.split()[0]
    pid = relay
    while True:
        pid = host.run(f"ps -o ppid= -p {pid}").stdout.strip()
        if host.run(f"ps -o comm= -p {pid}").stdout.strip().startswith("sshd"):
            break
    host.run(f"kill -9 {pid}")


def test_a_connection_that_died_mid_switch_is_reopened_for_the_next_request(
    fleet: HostSet, boxes: list[Host], tmp_path: Path
) -> None:
    """The controller's SSH connection to h1 dies while h1 switches: that request reads a transport
    error, h1's agent finishes the switch, and the controller's next request to h1 connects anew."""
    from orchestrator import settings
    from orchestrator.errors import TransportError
    from orchestrator.rollout.fanout import HostRequest
    from orchestrator.rollout.fleet import Fleet

    start_all(boxes[:1], args=["--load-time", "3"])
    ctl_fleet = Fleet(settings.load(write_config(tmp_path, controller_config(fleet, tmp_path / "ctl"))))
    try:
        client = ctl_fleet._clients(["h1"])["h1"]
        with ThreadPoolExecutor(max_workers=1) as pool:
            switching = pool.submit(ctl_fleet._run_all, [HostRequest("h1", client, "switch", {"model": "beta"})])
            wait_for(
                lambda: boxes[0].run("pgrep -f 'orchestrator[.]agent[.]relay'", check=False).returncode,
                lambda rc: rc == 0,
                timeout=60,
                what="the relay of the switch on h1",
            )
            _kill_ssh_session_of_the_relay(boxes[0])
            assert isinstance(switching.result(timeout=120)["h1"], TransportError)

        def status() -> Any:
            client = ctl_fleet._clients(["h1"])["h1"]
            return ctl_fleet._run_all([HostRequest("h1", client, "status", {"host": None})])["h1"]

        def switched(st: Any) -> bool:
            entry = next(iter(st["hosts"].values()))
            return (entry["serving"] or {}).get("model") == "beta" and not st["agent"]["running"]

        wait_for(
            status,
            lambda st: isinstance(st, dict) and switched(st),
            timeout=60,
            interval=0.5,
            what="h1's switch to end, seen over a new connection",
        )
    finally:
        ctl_fleet.close()
