"""The agent as a systemd unit inside a test host: local (pydbus) and SSH switches, crash recovery at
every phase boundary, schedules, and who may use its socket."""

from __future__ import annotations

import json
import shlex
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.core.render import render_agent_unit
from tests.hosts.machine import Host
from tests.test_switch_hosts import MODELS, config_text

REPO = Path(__file__).resolve().parents[1]
CONFIG = "/etc/orchestrator-agent-test.toml"
STATE = "/var/lib/orchestrator-agent-test"
HOOKS = "/run/orchestrator-hooks"
PY = sys.executable

pytestmark = pytest.mark.hosts


def wait_for(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


def cli(host: Host, *args: str, check: bool = True, user: str | None = None) -> Any:
    line = shlex.join([PY, "-m", "orchestrator", *args, "--config", CONFIG])
    if user:
        line = f"runuser -u {user} -- {line}"
    return host.run(line, check=check)


def history(host: Host) -> list[dict[str, Any]]:
    return list(json.loads(cli(host, "history", "--json").stdout))


def active(host: Host, unit: str) -> str:
    return str(host.run(["systemctl", "is-active", unit], check=False).stdout.strip())


def install_agent(host: Host, config: str) -> None:
    host.write_file(CONFIG, config)
    host.run(f"groupadd -f orchestrator && mkdir -p {HOOKS} && rm -f {HOOKS}/*")
    cfg_path = Path("/tmp") / f"agent-{host.name}.toml"
    cfg_path.write_text(config)
    unit = render_agent_unit(settings.load(cfg_path), (REPO / "templates/orchestrator-agent.service.j2").read_text(),
                             python=PY, config=CONFIG, extra_env={"ORCHESTRATOR_TEST_PAUSE_DIR": HOOKS})
    host.write_file("/etc/systemd/system/orchestrator-agent.service", unit.text)
    host.run("systemctl daemon-reload && systemctl start orchestrator-agent.service")


@pytest.fixture
def agent_host(hosts: list[Host]) -> Iterator[Host]:
    """h1 runs the agent (Type=notify) for itself over D-Bus."""
    host = hosts[0]
    install_agent(host, config_text(host, Path(STATE), MODELS, transport="local"))
    yield host
    host.run("systemctl stop orchestrator-agent.service", check=False)


def test_agent_is_ready_and_switches_through_dbus(agent_host: Host) -> None:
    """The agent reports READY to systemd and a CLI switch on the host goes through it."""
    assert active(agent_host, "orchestrator-agent.service") == "active"
    out = json.loads(cli(agent_host, "switch", "alpha", "--json").stdout)
    assert out["outcome"] == "active" and out["trigger"].startswith("cli:")
    status = json.loads(cli(agent_host, "status", "--json").stdout)
    assert status["agent"]["pid"] > 0
    metrics = urllib.request.urlopen("http://127.0.0.1:19464/metrics", timeout=10).read().decode()
    assert f'orchestrator_deployments_total{{host="{agent_host.name}",outcome="active"}} 1.0' in metrics
    assert f'orchestrator_active_model_info{{host="{agent_host.name}",model="alpha",revision="1"}} 1.0' in metrics
    assert 'orchestrator_phase_seconds_count{phase="checking"} 1.0' in metrics
    assert status["hosts"][agent_host.name]["serving"]["model"] == "alpha"
    assert active(agent_host, "vllm-alpha.service") == "active"


def test_agent_switches_another_host_over_ssh(hosts: list[Host]) -> None:
    """An agent in h1 switches h2 over SSH with strict host keys."""
    h1, h2 = hosts[0], hosts[1]
    h1.write_file("/etc/orchestrator-test-key", Path(h2.key_path).read_text(), mode=0o600)
    h1.write_file("/etc/orchestrator-test-known-hosts", Path(h2.known_hosts_path).read_text())
    cfg = config_text(h2, Path(STATE), MODELS).replace(str(h2.key_path), "/etc/orchestrator-test-key").replace(
        str(h2.known_hosts_path), "/etc/orchestrator-test-known-hosts")
    install_agent(h1, cfg)
    try:
        out = json.loads(cli(h1, "switch", "beta", "--json").stdout)
        assert out["outcome"] == "active" and out["host"] == h2.name
        assert active(h2, "vllm-beta.service") == "active"
        assert active(h1, "vllm-beta.service") != "active"
    finally:
        h1.run("systemctl stop orchestrator-agent.service", check=False)


CRASH_CASES = ["preflight", "staging", "stopping", "freeing", "installing", "starting", "checking", "routing",
               "rolling_back"]


@pytest.mark.parametrize("phase", CRASH_CASES)
def test_sigkill_at_phase_boundary_converges(agent_host: Host, phase: str) -> None:
    """SIGKILL the agent paused before PHASE; systemd restarts it and the switch converges."""
    host = agent_host
    cli(host, "switch", "alpha")
    target = "beta-crash" if phase == "rolling_back" else "beta"
    host.write_file(f"{HOOKS}/pause-at", phase)
    host.run(f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', target, '--config', CONFIG])} "
             f"> /tmp/switch.log 2>&1 &")
    wait_for(f"the engine to pause before {phase}",
             lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0)
    old_pid = host.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip()
    host.run(f"rm -f {HOOKS}/pause-at && systemctl kill -s SIGKILL orchestrator-agent.service")
    wait_for("systemd to restart the agent", lambda: host.run(
        ["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip() not in ("0", old_pid)
        and active(host, "orchestrator-agent.service") == "active")
    wait_for("the interrupted deployment to end", lambda: history(host)[0]["outcome"] in
             ("active", "rolled_back", "failed", "aborted"), timeout=90)
    newest = history(host)[0]
    outcome, serving = ("rolled_back", "alpha") if phase == "rolling_back" else ("active", target)
    assert (newest["outcome"], newest["model"]) == (outcome, target), newest.get("error")
    others = {"alpha", "beta", "beta-crash"} - {serving}
    assert active(host, f"vllm-{serving}.service") == "active"
    assert all(active(host, f"vllm-{m}.service") != "active" for m in others)
    print(f"crash case {phase}: outcome {newest['outcome']}, serving {serving}")


def test_schedule_set_a_minute_ahead_fires_and_is_recorded(hosts: list[Host]) -> None:
    """A redeploy scheduled a minute or so ahead runs and shows in history and schedules."""
    host = hosts[0]
    at = time.gmtime(time.time() + 90)  # the next minute that starts at least 30 s after the agent does
    cfg = config_text(host, Path(STATE), MODELS, transport="local") + (
        f'[schedules.soon]\ncron = "{at.tm_min} {at.tm_hour} * * *"\naction = "redeploy"\n')
    install_agent(host, cfg)
    try:
        cli(host, "switch", "alpha")
        listed = json.loads(cli(host, "schedules", "--json").stdout)
        assert listed[0]["name"] == "soon"
        wait_for("the schedule to fire", lambda: any(h["trigger"] == "schedule:soon" and h["outcome"] == "active"
                                                     for h in history(host)), timeout=150)
        listed = json.loads(cli(host, "schedules", "--json").stdout)
        assert listed[0]["last"]["kind"] == "schedule_fired"
        assert active(host, "vllm-alpha.service") == "active"
    finally:
        host.run("systemctl stop orchestrator-agent.service", check=False)


PING = ("import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(b'{\"op\": \"ping\"}\\n'); print(s.makefile().readline())")


def ping_as(host: Host, user: str) -> Any:
    # Debian's python: the test venv's interpreter lives under /root, which other users cannot enter.
    return host.run(f"runuser -u {user} -- /usr/bin/python3 -c {shlex.quote(PING)} {STATE}/agent.sock", check=False)


def test_socket_refuses_users_outside_its_group(agent_host: Host) -> None:
    """Mode 0660 keeps other users out; past the mode, the peer-credential check refuses them too."""
    host = agent_host
    host.run(f"id opuser >/dev/null 2>&1 || useradd -M -G orchestrator opuser; chmod 0755 {STATE}")
    refused = ping_as(host, "nobody")
    assert refused.returncode != 0 and "PermissionError" in refused.stderr
    member = ping_as(host, "opuser")
    assert '"result"' in member.stdout and '"pid"' in member.stdout, member.stderr
    host.run(f"chmod 0666 {STATE}/agent.sock")
    refused = ping_as(host, "nobody")
    assert "may not use the agent" in refused.stdout and '"result"' not in refused.stdout


def test_sigterm_parks_the_step_and_restart_resumes_it(agent_host: Host) -> None:
    """systemctl stop during a load: the agent exits cleanly, the deployment waits; the next start finishes it."""
    host = agent_host
    cli(host, "switch", "alpha")
    host.run(f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', 'beta-long', '--config', CONFIG])} "
             f"> /tmp/switch.log 2>&1 &")
    wait_for("the health check to start", lambda: bool(history(host)) and history(host)[0]["model"] == "beta-long"
             and history(host)[0]["outcome"] == "checking")
    host.run("systemctl stop orchestrator-agent.service")
    props = host.run(["systemctl", "show", "-p", "Result", "-p", "ExecMainStatus", "orchestrator-agent"]).stdout
    assert "Result=success" in props and "ExecMainStatus=0" in props
    parked = json.loads(cli(host, "history", "--json", "--local").stdout)[0]
    assert (parked["model"], parked["outcome"]) == ("beta-long", "checking")
    host.run("systemctl start orchestrator-agent.service")
    wait_for("the parked deployment to finish", lambda: history(host)[0]["outcome"] == "active")
    assert active(host, "vllm-beta-long.service") == "active" and active(host, "vllm-alpha.service") == "inactive"


def test_watch_restarts_a_model_that_stays_unhealthy(agent_host: Host) -> None:
    """A serving unit that stops and stays down past unhealthy_after_s is recorded and redeployed."""
    host = agent_host
    cli(host, "switch", "alpha")
    host.run("systemctl stop vllm-alpha.service")
    wait_for("the watch to redeploy alpha", lambda: any(
        h["trigger"] == "watch:restart" and h["outcome"] == "active" for h in history(host)), timeout=60)
    assert active(host, "vllm-alpha.service") == "active"
    status = json.loads(cli(host, "status", "--json").stdout)
    assert status["hosts"][host.name]["serving"]["model"] == "alpha"


@pytest.mark.parametrize("phase", ["checking", "routing"])
def test_sigkill_during_a_proxy_handover_converges_and_repairs_the_proxy(hosts: list[Host], phase: str) -> None:
    """SIGKILL before PHASE of chat-a -> chat-b with a half-written proxy config: recovery ends with
    chat-b alone serving and the proxy routing chat to it."""
    from tests.test_proxy_hosts import MODELS as PROXY_MODELS
    from tests.test_proxy_hosts import PROXY_PORT, proxy_config
    host = hosts[0]
    install_agent(host, proxy_config(host, Path(STATE), {k: v for k, v in PROXY_MODELS.items()}).replace(
        'transport = "ssh"', 'transport = "local"'))
    try:
        cli(host, "switch", "chat-a")
        host.write_file(f"{HOOKS}/pause-at", phase)
        host.run(f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', 'chat-b', '--config', CONFIG])} "
                 f"> /tmp/switch.log 2>&1 &")
        wait_for(f"the engine to pause before {phase}",
                 lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0)
        # Half-updated: a config on disk the running proxy never loaded.
        host.run("sed -i 's/8101/8109/' /etc/orchestrator/haproxy.cfg")
        old_pid = host.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip()
        host.run(f"rm -f {HOOKS}/pause-at && systemctl kill -s SIGKILL orchestrator-agent.service")
        wait_for("systemd to restart the agent", lambda: host.run(
            ["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip()
            not in ("0", old_pid))
        wait_for("the interrupted deployment to end", lambda: history(host)[0]["outcome"] in
                 ("active", "rolled_back", "failed", "aborted"), timeout=90)
        newest = history(host)[0]
        assert (newest["outcome"], newest["model"]) == ("active", "chat-b"), newest.get("error")
        assert (active(host, "vllm-chat-a.service"), active(host, "vllm-chat-b.service")) == ("inactive", "active")
        body = json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"http://{host.address}:{PROXY_PORT}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["model"] == "chat"
        assert "8102" in host.run(["cat", "/etc/orchestrator/haproxy.cfg"]).stdout
    finally:
        host.run("systemctl stop orchestrator-agent.service orchestrator-proxy.service; "
                 "rm -f /etc/orchestrator/haproxy.cfg*", check=False)
