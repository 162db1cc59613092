"""The dashboard's socket: real HTTP on a real Unix socket, the agent in this process over fake ports.
Pages come from the agent's own answers; anyone outside the socket group gets 403; nothing writes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.dashboard.live import Live
from orchestrator.dashboard.server import DashboardServer
from orchestrator.dashboard.service import start
from orchestrator.deploy.operations import Operations
from orchestrator.testing import (
    FakeClock,
    FakeHost,
    FakeProxy,
    FakeResidencyStore,
    FakeStateStore,
    FakeWeights,
)
from tests.builders.unix_http import UnixHTTP

from .conftest import OpsWorld, make_catalog

GROUP = "users"  # exists on Debian (gid 100): a group a test process can join with setpriv


@dataclass
class Running:
    world: OpsWorld
    agent: Agent
    server: DashboardServer
    path: str

    def get(self, url: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
        conn = UnixHTTP(self.path)
        try:
            conn.request(method, url)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read().decode()
        finally:
            conn.close()


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    public = Path(tempfile.mkdtemp(prefix="dash-", dir="/tmp"))  # every user may reach the socket in it
    public.chmod(0o755)
    path = str(public / "dashboard.sock")
    world = OpsWorld(tmp_path / "state", socket_group=GROUP, dashboard={"socket": path, "refresh_s": 0.2})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    yield Running(world, agent, server, path)
    server.close()
    public.rmdir()


def as_user(path: str, gid: int = 65534, url: str = "/") -> str:
    """GET ``url`` on the socket as uid 65534 (nobody) with primary group ``gid`` and no other: the raw reply."""
    script = (
        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); "
        "s.sendall(b'GET ' + sys.argv[2].encode() "
        "+ b' HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n'); "
        "s.settimeout(10); out=b''\n"
        "while (c := s.recv(65536)): out += c\nprint(out.decode())"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", f"--regid={gid}", "--clear-groups", sys.executable, "-c", script, path, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_box_page_shows_gpus_held_by_the_serving_model(running: Running) -> None:
    """After a switch, the page lists the model as serving and names it on the GPUs its unit holds."""
    running.world.ops.switch("alpha")
    status, headers, body = running.get("/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'data-model="alpha" data-state="serving"' in body
    assert 'data-model="beta" data-state="stopped"' in body
    box = json.loads(running.get("/api/box")[2])
    held = {g["index"]: g["models"] for g in box["hosts"][0]["gpus"]["rows"]}
    assert held[0] == ["alpha"] and held[4] == []


def test_history_rows_carry_phase_durations_and_downtime(running: Running) -> None:
    """A finished switch shows in the history table with its phases and the downtime it cost."""
    running.world.ops.switch("alpha")
    running.world.ops.switch("beta")
    box = json.loads(running.get("/api/box")[2])
    newest = box["hosts"][0]["history"][0]
    assert newest["model"] == "beta" and newest["outcome"] == "active"
    assert {p["phase"] for p in newest["phases"]} >= {"stopping", "starting", "checking"}
    assert newest["downtime_s"] is not None
    assert box["hosts"][0]["downtime"]["x"]  # the chart has the switches that stopped something


def test_recorded_benchmarks_show_per_model_and_concurrency(running: Running) -> None:
    """A bench stored with a revision (as `orchestrator bench` stores it) is a row and a chart series."""
    dep = running.world.ops.switch("alpha")
    levels = [{"concurrency": c, "output_tok_s": 100.0 * c, "ttft_ms": {"p90": 20.0 + c}} for c in (1, 16)]
    running.world.ops.record_bench(dep["id"], {"levels": levels})
    body = running.get("/")[2]
    assert '<tr data-model="alpha"><td>alpha</td><td>1</td><td>TP=4</td>' in body
    assert "<th>tok/s C=16</th>" in body and ">1600<" in body and ">36 ms<" in body
    chart = json.loads(running.get("/api/box")[2])["hosts"][0]["bench"]
    assert chart == [
        {
            "model": "alpha",
            "revision": 1,
            "layout": "TP=4",
            "levels": {"1": {"tok_s": 100.0, "ttft_p90_ms": 21.0}, "16": {"tok_s": 1600.0, "ttft_p90_ms": 36.0}},
        }
    ]


def test_a_user_outside_the_socket_group_gets_403(running: Running) -> None:
    """Peer credentials decide: uid 65534 in no group is refused with 403 naming its uid and the group."""
    reply = as_user(running.path)
    assert reply.startswith("HTTP/1.1 403")
    assert "uid 65534 may not use the dashboard" in reply and f"group {GROUP!r}" in reply
    assert "<table" not in reply


def test_a_member_of_the_socket_group_gets_the_page(running: Running) -> None:
    """The same uid with the socket group as its group gets the page, as it gets the agent's socket."""
    reply = as_user(running.path, 100)
    assert reply.startswith("HTTP/1.1 200") and 'class="gpus"' in reply


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_the_dashboard_is_read_only(running: Running, method: str) -> None:
    """Anything but GET and HEAD is refused with 405 and changes nothing."""
    status, headers, body = running.get("/", method)
    assert status == 405 and headers["Allow"] == "GET, HEAD" and "read-only" in body
    assert running.world.ops.history("box") == []


@pytest.mark.parametrize(
    "path",
    [
        "/static/../server.py",
        "/static/..%2fserver.py",
        "/static/server.py",
        "/static/.hidden.js",
        "/etc/passwd",
        "/tune/999",
    ],
)
def test_nothing_outside_the_pages_and_static_files_is_served(running: Running, path: str) -> None:
    """Paths outside the known pages and the package's static files are 404."""
    assert running.get(path)[0] == 404


def raw_get(path: str, target: bytes) -> bytes:
    """GET ``target`` (bytes as sent on the request line) on the dashboard socket: the whole reply."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.settimeout(10)
        s.connect(path)
        s.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    finally:
        s.close()


@pytest.mark.parametrize(
    "target", [b"/tune/\xb2", b"/tune/" + b"9" * 5000, b"/tune/" + b"9" * 30, "/tune/\u0663".encode()]
)
def test_a_tune_page_that_is_no_run_number_is_404(running: Running, target: bytes) -> None:
    """'/tune/\u00b2', 5,000 digits, a number past SQLite's integers, an Arabic-Indic digit:
    404, never a dropped connection."""
    assert raw_get(running.path, target).startswith(b"HTTP/1.1 404 ")


def test_connections_past_the_bound_get_503(running: Running) -> None:
    """The dashboard serves a bounded number of connections at once: one more is answered 503 and closed."""
    from orchestrator.dashboard.server import MAX_CONNECTIONS

    held = []
    try:
        for _ in range(MAX_CONNECTIONS):  # idle keep-alive connections, each holding a thread
            s = socket.socket(socket.AF_UNIX)
            s.connect(running.path)
            held.append(s)
        deadline = time.monotonic() + 10
        while (reply := raw_get(running.path, b"/api/box")).startswith(b"HTTP/1.1 200") and time.monotonic() < deadline:
            time.sleep(0.05)  # the accepting thread may not have taken every held connection yet
        assert reply.startswith(b"HTTP/1.1 503 ") and b"already serves 64 connections" in reply
    finally:
        for s in held:
            s.close()


def test_static_files_are_the_vendored_chart_library(running: Running) -> None:
    """uPlot is served from the package, with its licence beside it."""
    status, headers, body = running.get("/static/uPlot.iife.min.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and "uPlot" in body
    assert "MIT License" in running.get("/static/uPlot.LICENSE.txt")[2]


def test_pages_forbid_inline_and_foreign_scripts(running: Running) -> None:
    """Every page carries a CSP that allows only the dashboard's own files."""
    headers = running.get("/")[1]
    assert headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")


def test_the_event_stream_sends_the_live_sections(running: Running) -> None:
    """/events is SSE whose first message holds each section's HTML, rendered as on the page."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(running.path)
        s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        buf = b""
        while b"\n\n" not in buf.partition(b"\r\n\r\n")[2]:
            buf += s.recv(65536)
    head, _, stream = buf.partition(b"\r\n\r\n")
    assert b"Content-Type: text/event-stream" in head
    event, data = stream.split(b"\n")[:2]
    assert event == b"event: sections"
    msg = json.loads(data.removeprefix(b"data: "))
    assert set(msg["html"]) == {"h0-gpus", "h0-models", "h0-operation", "h0-history", "h0-events", "h0-bench"}
    assert "no operation running" in msg["html"]["h0-operation"]


def read_sections(stream: Any) -> dict[str, Any]:
    """The next SSE message's sections."""
    for line in stream:
        if line.startswith(b"data: "):
            return dict(json.loads(line[6:]))
    raise AssertionError("the event stream ended")


def test_a_job_of_the_agent_reaches_an_open_page_without_waiting_for_a_refresh(tmp_path: Path) -> None:
    """With no periodic refresh at all (60 s), a switch submitted to the agent, however short, is pushed
    to an open page as it starts and ends: the page learns from the agent's jobs, not from polling."""
    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(tmp_path / "d.sock"), "refresh_s": 60})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)  # far below the 60 s refresh: only a push can answer in time
            s.connect(str(tmp_path / "d.sock"))
            s.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            stream = s.makefile("rb")
            assert 'data-state="stopped"' in read_sections(stream)["html"]["h0-models"]
            list(agent.dispatch("switch", {"model": "alpha"}, "test"))  # returns when the job ended
            while 'data-model="alpha" data-state="serving"' not in read_sections(stream)["html"]["h0-models"]:
                pass
    finally:
        server.close()


def test_status_says_where_the_dashboard_serves(running: Running) -> None:
    """The agent's status names the dashboard socket (what `orchestrator dashboard` forwards)."""
    running.agent.dashboard_socket = running.path
    reply = list(running.agent.dispatch("status", {}, "test"))[-1]["result"]
    assert reply["agent"]["dashboard"] == running.path


def test_a_disabled_dashboard_opens_no_socket(tmp_path: Path) -> None:
    """enabled = false: no socket is made at all."""
    world = OpsWorld(tmp_path / "state", dashboard={"enabled": False, "socket": str(tmp_path / "d.sock")})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    assert start(agent) is None and not os.path.exists(tmp_path / "d.sock")


def warm_agent(tmp_path: Path) -> tuple[Agent, Operations, FakeHost]:
    """An agent over one fake host whose two models sleep instead of stopping (warm switches)."""
    tp4 = {"tensor_parallel": 4, "gpus": [0, 1, 2, 3], "sleep": "level1"}
    catalog = make_catalog(
        state_dir=str(tmp_path / "state"),
        dashboard={"socket": str(tmp_path / "d.sock")},
        proxy={"enabled": True, "port": 8000},
        hosts={
            "box": {
                "transport": "ssh",
                "address": "127.0.0.9",
                "gpus": 8,
                "gpu_memory_gib": 96,
                "sleep_ram_gib": 100,
                "sleep_residue_gib": 2,
            }
        },
        models={"alpha": {"repo": "org/alpha", "port": 8001, **tp4}, "beta": {"repo": "org/beta", "port": 8002, **tp4}},
    )
    clock = FakeClock()
    host = FakeHost(name="box", clock=clock)
    ports = host.ports(catalog.hosts["box"], FakeWeights())
    ports.proxy = FakeProxy()
    ops = Operations(catalog, lambda name: ports, store=FakeStateStore(), residency=FakeResidencyStore())
    return Agent(catalog, ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=clock), ops, host


def test_the_box_page_shows_an_asleep_model_its_host_ram_and_its_gpu_residue(tmp_path: Path) -> None:
    """alpha then beta: alpha sleeps; the models table says asleep (level 1) with the RAM it holds, the
    host line the RAM held against the budget, and alpha's engine on the GPUs is named, as a residue."""
    agent, ops, box = warm_agent(tmp_path)
    ops.switch("alpha")
    serving = ops.serving("box")
    assert serving is not None
    box.sizes[serving.spec.model_dir] = 20 * 2**30  # what alpha's weights hold in host RAM asleep
    ops.switch("beta")
    server = start(agent)
    assert server is not None
    try:
        run = Running(None, agent, server, str(tmp_path / "d.sock"))  # type: ignore[arg-type]
        body = run.get("/")[2]
        host = json.loads(run.get("/api/box")[2])["hosts"][0]
    finally:
        server.close()
    models = {m["model"]: m for m in host["models"]}
    assert (models["alpha"]["state"], models["alpha"]["residency"]) == ("asleep", "asleep (level 1)")
    assert (models["beta"]["state"], models["beta"]["residency"]) == ("serving", "awake")
    assert models["alpha"]["ram_gib"] == 20.0 and models["beta"]["ram_gib"] == 0
    assert host["sleep"]["held_gib"] == models["alpha"]["ram_gib"] and host["sleep"]["budget_gib"] == 100
    assert host["sleep"]["sleepers"] == ["alpha"]
    procs = {p["model"]: p for p in host["gpus"]["rows"][0]["processes"]}
    assert set(procs) == {"alpha", "beta"} and procs["alpha"]["asleep"] and not procs["beta"]["asleep"]
    assert 'data-model="alpha" data-state="asleep"' in body and "20.0 of 100.0 GiB" in body
    assert "asleep: residue" in body


def test_progress_the_page_does_not_show_does_not_re_read_the_box(tmp_path: Path) -> None:
    """stage_progress (many a second while staging) bumps no version, so no page re-reads status and the
    GPUs for it; a phase event does."""
    from orchestrator.agent.server import Job

    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(tmp_path / "d.sock")})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    live = Live(agent, 60.0, lambda host: [])
    job = Job("box", "switch", {"model": "alpha"})
    live._observe("started", job)
    seen = live.version
    for _ in range(50):
        job.publish({"event": "stage_progress", "fields": {"bytes": 1}})
    job.publish({"event": "phase", "fields": {"phase": "stopping", "revision": 1, "model": "alpha"}})
    assert live.wait(seen, timeout=30) == seen + 1
    assert [e["event"] for e in live.events["box"]] == ["phase"]
    job.publish(Job.END)
