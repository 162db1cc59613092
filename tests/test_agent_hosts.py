"""The agent as a systemd unit inside a test host: local (pydbus) and SSH switches, crash recovery at
every phase boundary, schedules, and who may use its socket."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.builders.agent import (
    CONFIG,
    HOOKS,
    METRICS,
    PY,
    STATE,
    active,
    cli,
    history,
    install_agent,
    main_pid,
    sigkill_agent,
)
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_switch_hosts import MODELS, config_text

pytestmark = pytest.mark.hosts


def metrics(host: Host) -> str:
    return str(urllib.request.urlopen(METRICS[host.name], timeout=10).read().decode())


@pytest.fixture
def agent_host(hosts: list[Host], tmp_path: Path) -> Iterator[Host]:
    """h1 runs the agent (Type=notify) for itself over D-Bus."""
    host = hosts[0]
    install_agent(host, config_text(host, Path(STATE), MODELS, transport="local"), tmp_path)
    yield host
    host.run("systemctl stop orchestrator-agent.service", check=False)


def test_agent_is_ready_and_switches_through_dbus(agent_host: Host) -> None:
    """The agent reports READY to systemd and a CLI switch on the host goes through it."""
    assert active(agent_host, "orchestrator-agent.service") == "active"
    out = json.loads(cli(agent_host, "switch", "alpha", "--json").stdout)
    # The caller as the box saw it: the peer's uid and the origin of its SSH login (the harness runs the
    # CLI in the host over ssh from this machine), never the client's word.
    assert out["outcome"] == "active" and out["trigger"] == "root@127.0.0.1"
    status = json.loads(cli(agent_host, "status", "--json").stdout)
    assert status["agent"]["pid"] > 0
    text = metrics(agent_host)
    assert f'orchestrator_deployments_total{{host="{agent_host.name}",outcome="active"}} 1.0' in text
    assert f'orchestrator_active_model_info{{host="{agent_host.name}",model="alpha",revision="1"}} 1.0' in text
    assert 'orchestrator_phase_seconds_count{phase="checking"} 1.0' in text
    assert status["hosts"][agent_host.name]["serving"]["model"] == "alpha"
    assert active(agent_host, "vllm-alpha.service") == "active"


def install_ssh_agent(h1: Host, h2: Host, tmp: Path) -> None:
    """h1 runs the agent for h2, reached over SSH with strict host keys."""
    h1.write_file("/etc/orchestrator-test-key", Path(h2.key_path).read_text(), mode=0o600)
    h1.write_file("/etc/orchestrator-test-known-hosts", Path(h2.known_hosts_path).read_text())
    cfg = (
        config_text(h2, Path(STATE), MODELS)
        .replace(str(h2.key_path), "/etc/orchestrator-test-key")
        .replace(str(h2.known_hosts_path), "/etc/orchestrator-test-known-hosts")
    )
    install_agent(h1, cfg, tmp)


def test_agent_switches_another_host_over_ssh(hosts: list[Host], tmp_path: Path) -> None:
    """An agent in h1 switches h2 over SSH with strict host keys."""
    h1, h2 = hosts[0], hosts[1]
    install_ssh_agent(h1, h2, tmp_path)
    try:
        out = json.loads(cli(h1, "switch", "beta", "--json").stdout)
        assert out["outcome"] == "active" and out["host"] == h2.name
        assert active(h2, "vllm-beta.service") == "active"
        assert active(h1, "vllm-beta.service") != "active"
    finally:
        h1.run("systemctl stop orchestrator-agent.service", check=False)


def kill_agent_paused_before(host: Host, phase: str, model: str) -> None:
    """`switch MODEL` in the background, paused before PHASE; the agent SIGKILLed there; returns once
    systemd restarted it and the interrupted deployment ended."""
    host.write_file(f"{HOOKS}/pause-at", phase)
    host.run(
        f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', model, '--config', CONFIG])} > /tmp/switch.log 2>&1 &"
    )
    wait_for(
        lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0,
        what=f"the engine to pause before {phase}",
        timeout=60,
    )
    sigkill_agent(host, "pause-at")
    wait_for(
        lambda: history(host)[0]["outcome"] in ("active", "rolled_back", "failed", "aborted"),
        what="the interrupted deployment to end",
        timeout=90,
    )


CRASH_CASES = [
    "preflight",
    "staging",
    "stopping",
    "freeing",
    "installing",
    "starting",
    "checking",
    "routing",
    "rolling_back",
]


@pytest.mark.parametrize("phase", CRASH_CASES)
def test_sigkill_at_phase_boundary_converges(agent_host: Host, phase: str) -> None:
    """SIGKILL the agent paused before PHASE; systemd restarts it and the switch converges."""
    host = agent_host
    cli(host, "switch", "alpha")
    target = "beta-crash" if phase == "rolling_back" else "beta"
    kill_agent_paused_before(host, phase, target)
    newest = history(host)[0]
    outcome, serving = ("rolled_back", "alpha") if phase == "rolling_back" else ("active", target)
    assert (newest["outcome"], newest["model"]) == (outcome, target), newest.get("error")
    others = {"alpha", "beta", "beta-crash"} - {serving}
    assert active(host, f"vllm-{serving}.service") == "active"
    assert all(active(host, f"vllm-{m}.service") != "active" for m in others)
    print(f"crash case {phase}: outcome {newest['outcome']}, serving {serving}")


def test_schedule_fires_through_the_agent(hosts: list[Host], tmp_path: Path) -> None:
    """End to end (the decisions are unit-tested on a fake clock): a redeploy every minute runs and is recorded."""
    host = hosts[0]
    cfg = config_text(host, Path(STATE), MODELS, transport="local") + (
        '[schedules.soon]\ncron = "* * * * *"\naction = "redeploy"\n'
    )  # the finest a 5-field cron fires
    # The agent's wall clock runs ahead so that its minute ends 10 s after it starts (alpha serves by
    # then): the first firing comes then rather than at the real minute's end, 30 s later on average.
    install_agent(host, cfg, tmp_path, hook_args="--minute-ends-in 10")
    try:
        cli(host, "switch", "alpha")
        wait_for(
            lambda: any(h["trigger"] == "schedule:soon" and h["outcome"] == "active" for h in history(host)),
            what="the schedule to redeploy alpha",
            timeout=150,
        )
        listed = json.loads(cli(host, "schedules", "--json").stdout)
        assert listed[0]["name"] == "soon" and listed[0]["last"]["kind"].startswith("schedule_")
        # Awaited, not sampled: the next firing may be stopping the unit right now; it ends active again.
        wait_for(
            lambda: active(host, "vllm-alpha.service"),
            lambda state: state == "active",
            what="vllm-alpha.service active after the scheduled redeploys",
            timeout=150,
        )
    finally:
        host.run("systemctl stop orchestrator-agent.service", check=False)


PING = (
    "import json, socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
    's.sendall(b\'{"op": "ping"}\\n\'); print(s.makefile().readline())'
)


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
    host.run(
        f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', 'beta-long', '--config', CONFIG])} "
        f"> /tmp/switch.log 2>&1 &"
    )
    wait_for(
        lambda: history(host)[:1],
        lambda h: [(d["model"], d["outcome"]) for d in h] == [("beta-long", "checking")],
        what="the health check to start",
        timeout=60,
    )
    host.run("systemctl stop orchestrator-agent.service")
    props = host.run(["systemctl", "show", "-p", "Result", "-p", "ExecMainStatus", "orchestrator-agent"]).stdout
    assert "Result=success" in props and "ExecMainStatus=0" in props
    parked = json.loads(cli(host, "history", "--json", "--local").stdout)[0]
    assert (parked["model"], parked["outcome"]) == ("beta-long", "checking")
    host.run("systemctl start orchestrator-agent.service")
    wait_for(lambda: history(host)[0]["outcome"] == "active", what="the parked deployment to finish", timeout=60)
    assert active(host, "vllm-beta-long.service") == "active" and active(host, "vllm-alpha.service") == "inactive"


def test_watch_restarts_a_model_that_stays_unhealthy(agent_host: Host) -> None:
    """A serving unit that stops and stays down past unhealthy_after_s is recorded and redeployed."""
    host = agent_host
    cli(host, "switch", "alpha")
    host.run("systemctl stop vllm-alpha.service")
    wait_for(
        lambda: any(h["trigger"] == "watch:restart" and h["outcome"] == "active" for h in history(host)),
        what="the watch to redeploy alpha",
        timeout=60,
    )
    assert active(host, "vllm-alpha.service") == "active"
    status = json.loads(cli(host, "status", "--json").stdout)
    assert status["hosts"][host.name]["serving"]["model"] == "alpha"


OUTAGE = (
    "sleep 1; systemctl stop ssh.service; systemctl kill -s SIGKILL ssh.service; "
    "while [ ! -e /var/tmp/ssh-back ]; do sleep 0.2; done; rm -f /var/tmp/ssh-back; systemctl start ssh.service"
)


def store_events(host: Host, kind: str) -> list[dict[str, Any]]:
    code = (
        "import json, sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(json.dumps([json.loads(d) for "
        "(d,) in db.execute('SELECT detail FROM events WHERE kind=? ORDER BY rowid', (sys.argv[2],))]))"
    )
    return list(json.loads(host.run_python(code, f"{STATE}/state.db", kind).stdout))


def test_watch_survives_an_ssh_outage_and_acts_afterwards(hosts: list[Host], tmp_path: Path) -> None:
    """sshd of the watched host goes away (the agent even restarts meanwhile) and comes back: the watch
    records the failure, carries on, and afterwards still restarts a model that went down."""
    h1, h2 = hosts[0], hosts[1]
    install_ssh_agent(h1, h2, tmp_path)
    back = h2.root / "var/tmp/ssh-back"  # the host's root as this machine sees it: no SSH needed
    try:
        assert json.loads(cli(h1, "switch", "alpha", "--json").stdout)["outcome"] == "active"
        h2.run(["systemd-run", "--unit=ssh-outage", "--collect", "sh", "-c", OUTAGE])
        wait_for(lambda: h2.run("true", check=False).returncode != 0, what="sshd of h2 to go away")
        h1.run("systemctl restart orchestrator-agent.service")  # its first connection to h2 now fails
        pid = main_pid(h1)

        def restarted_agent_counted_a_watch_failure() -> bool:
            try:
                return 'orchestrator_loop_failures_total{loop="watch"}' in metrics(h1)
            except OSError:  # its metrics server not listening yet
                return False

        # Awaited on the restarted agent's own counter: the agent before the restart may have recorded a
        # failure of its own (sshd went away while it watched), which a wait on the store alone would take.
        wait_for(restarted_agent_counted_a_watch_failure, what="the restarted agent to count the watch's failure")
        failed = wait_for(lambda: store_events(h1, "loop_failed"), what="the watch to record the failure")
        assert failed[-1]["loop"] == "watch" and h2.address in failed[-1]["error"]
        back.touch()
        wait_for(lambda: h2.run("true", check=False).returncode == 0, what="sshd of h2 to come back", timeout=60)
        wait_for(lambda: store_events(h1, "loop_recovered"), what="the watch to reach h2 again")
        h2.run("systemctl stop vllm-alpha.service")
        # The restart's own outcome is the engine's business (rolled_back is seen now and then: systemd in
        # a test host answers a cgroup kill with EIO); what matters here is that the watch acted.
        wait_for(
            lambda: any(
                h["trigger"] == "watch:restart" and h["outcome"] in ("active", "rolled_back") for h in history(h1)
            ),
            what="the watch to redeploy alpha on h2",
            timeout=60,
        )
        assert active(h2, "vllm-alpha.service") == "active"
        assert main_pid(h1) == pid  # the same agent: its watch lived through the outage
    finally:
        back.touch()
        wait_for(lambda: h2.run("true", check=False).returncode == 0, what="sshd of h2 back", timeout=60)
        h2.run("rm -f /var/tmp/ssh-back")
        h1.run("systemctl stop orchestrator-agent.service", check=False)


@pytest.mark.parametrize("phase", ["checking", "routing"])
def test_sigkill_during_a_proxy_handover_converges_and_repairs_the_proxy(
    hosts: list[Host], phase: str, tmp_path: Path
) -> None:
    """SIGKILL before PHASE of chat-a -> chat-b with a half-written proxy config: recovery ends with
    chat-b alone serving and the proxy routing chat to it."""
    from tests.builders.proxy import MODELS as PROXY_MODELS
    from tests.builders.proxy import PROXY_PORT, proxy_config

    host = hosts[0]
    install_agent(
        host,
        proxy_config(host, Path(STATE), {k: v for k, v in PROXY_MODELS.items()}).replace(
            'transport = "ssh"', 'transport = "local"'
        ),
        tmp_path,
    )
    try:
        cli(host, "switch", "chat-a")
        host.write_file(f"{HOOKS}/pause-at", phase)
        host.run(
            f"nohup {shlex.join([PY, '-m', 'orchestrator', 'switch', 'chat-b', '--config', CONFIG])} "
            f"> /tmp/switch.log 2>&1 &"
        )
        wait_for(
            lambda: host.run(["test", "-f", f"{HOOKS}/paused"], check=False).returncode == 0,
            what=f"the engine to pause before {phase}",
        )
        # Half-updated: a config on disk the running proxy never loaded.
        host.run("sed -i 's/8101/8109/' /etc/orchestrator/haproxy.cfg")
        sigkill_agent(host, "pause-at")
        wait_for(
            lambda: history(host)[0]["outcome"] in ("active", "rolled_back", "failed", "aborted"),
            what="the interrupted deployment to end",
            timeout=90,
        )
        newest = history(host)[0]
        assert (newest["outcome"], newest["model"]) == ("active", "chat-b"), newest.get("error")
        assert (active(host, "vllm-chat-a.service"), active(host, "vllm-chat-b.service")) == ("inactive", "active")
        body = json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode()
        req = urllib.request.Request(
            f"http://{host.address}:{PROXY_PORT}/v1/completions",
            data=body,
            headers={"content-type": "application/json"},
        )
        assert json.loads(urllib.request.urlopen(req, timeout=10).read())["model"] == "chat"
        assert "8102" in host.run(["cat", "/etc/orchestrator/haproxy.cfg"]).stdout
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service orchestrator-proxy.service; "
            "rm -f /etc/orchestrator/haproxy.cfg*",
            check=False,
        )


def test_an_agent_restarted_with_the_proxy_off_stops_the_proxy_left_running(hosts: list[Host], tmp_path: Path) -> None:
    """The proxy serves chat-a; deploy.toml edited to [proxy] enabled = false and the agent restarted (no
    push): the agent's start stops and disables orchestrator-proxy.service; chat-a serves on its own port."""
    from tests.builders.proxy import MODELS as PROXY_MODELS
    from tests.builders.proxy import proxy_config

    host = hosts[0]
    config = proxy_config(host, Path(STATE), dict(PROXY_MODELS)).replace('transport = "ssh"', 'transport = "local"')
    install_agent(host, config, tmp_path)
    try:
        cli(host, "switch", "chat-a")
        assert active(host, "orchestrator-proxy.service") == "active"
        host.write_file(CONFIG, host.run(["cat", CONFIG]).stdout.replace("enabled = true\n", "enabled = false\n", 1))
        host.run("systemctl restart orchestrator-agent.service")
        wait_for(
            lambda: active(host, "orchestrator-proxy.service"),
            lambda s: s == "inactive",
            what="the agent's start to stop the proxy left running",
        )
        enabled = host.run(["systemctl", "is-enabled", "orchestrator-proxy.service"], check=False).stdout.strip()
        assert enabled == "disabled"
        assert [e["was_running"] for e in store_events(host, "proxy_stopped")] == [True]
        assert active(host, "vllm-chat-a.service") == "active"
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service orchestrator-proxy.service; "
            "rm -f /etc/orchestrator/haproxy.cfg*",
            check=False,
        )


def proxy_answer(host: Host, port: int, model: str) -> tuple[int, str] | None:
    """(status, error code) of a completion through the host's proxy; None while nothing listens."""
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 2}).encode()
    req = urllib.request.Request(
        f"http://{host.address}:{port}/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, ""
    except urllib.error.HTTPError as err:
        return err.code, str(json.loads(err.read())["error"]["code"])
    except urllib.error.URLError:
        return None


def test_an_agent_with_the_proxy_on_answers_on_its_port_before_any_switch(hosts: list[Host], tmp_path: Path) -> None:
    """A fresh agent with [proxy] on and nothing served: its start brings the proxy up; a catalog name
    answers 503 model_not_loaded, an unknown one 404 (before, nothing listened until the first switch)."""
    from tests.builders.proxy import MODELS as PROXY_MODELS
    from tests.builders.proxy import PROXY_PORT, proxy_config

    host = hosts[0]
    host.run("systemctl stop orchestrator-proxy.service; rm -f /etc/orchestrator/haproxy.cfg*", check=False)
    config = proxy_config(host, Path(STATE), dict(PROXY_MODELS)).replace('transport = "ssh"', 'transport = "local"')
    install_agent(host, config, tmp_path)
    try:
        first = wait_for(
            lambda: proxy_answer(host, PROXY_PORT, "chat"),
            lambda a: a is not None,
            what="the proxy answering after the agent's start",
        )
        assert first == (503, "model_not_loaded")
        assert proxy_answer(host, PROXY_PORT, "nope") == (404, "model_not_found")
        assert active(host, "vllm-chat-a.service") != "active"
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service orchestrator-proxy.service; "
            "rm -f /etc/orchestrator/haproxy.cfg*",
            check=False,
        )
