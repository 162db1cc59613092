"""The fleet page of a controller's agent: real HTTP on the dashboard's Unix socket, the real controller
and fleet code against simulated box agents (rollout/simulated.py), the rollout store in memory."""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.controller import FleetController
from orchestrator.agent.daemon import Agent
from orchestrator.contract.args import RolloutStartArgs
from orchestrator.core import dashboard_fleet as fv
from orchestrator.core.rollout import Policy, RolloutStatus
from orchestrator.dashboard.server import DashboardServer
from orchestrator.dashboard.service import start
from orchestrator.deploy.operations import Operations
from orchestrator.errors import TransportError
from orchestrator.rollout.simulated import SimulatedBox
from orchestrator.testing import FakeClock, FakeRolloutStore, FakeStateStore
from tests.builders.unix_http import UnixHTTP
from tests.hosts.wait import wait_for

from .conftest import make_catalog
from .test_dashboard_server import as_user

HOSTS = ["h1", "h2", "h3", "h4"]


def fleet_catalog(state_dir: Path, socket_path: str) -> Any:
    hosts = {
        h: {"transport": "ssh", "address": f"127.0.0.{i + 10}", "gpus": 8, "gpu_memory_gib": 96}
        for i, h in enumerate(HOSTS)
    }
    return make_catalog(
        state_dir=str(state_dir),
        hosts=hosts,
        socket_group="users",
        dashboard={"socket": socket_path, "refresh_s": 0.2},
        groups={"inference": {"hosts": HOSTS, "canary": 1, "batch": 2}},
        models={
            "beta": {
                "repo": "org/beta",
                "group": "inference",
                "gpus": [0, 1, 2, 3],
                "tensor_parallel": 4,
                "port": 8001,
                "source": "none",
            }
        },
    )


@dataclass
class Ctl:
    agent: Agent
    server: DashboardServer
    boxes: dict[str, SimulatedBox]
    hold: threading.Event
    path: str

    def get(self, url: str) -> tuple[int, dict[str, str], str]:
        conn = UnixHTTP(self.path)
        try:
            conn.request("GET", url)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read().decode()
        finally:
            conn.close()

    def fleet(self) -> dict[str, Any]:
        return dict(json.loads(self.get("/api/fleet")[2])["groups"][0])


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[Ctl]:
    public = Path(tempfile.mkdtemp(prefix="dash-", dir="/tmp"))  # every user may reach the socket in it
    public.chmod(0o755)
    path = str(public / "dashboard.sock")
    catalog = fleet_catalog(tmp_path / "state", path)
    hold = threading.Event()
    boxes = {h: SimulatedBox(h, {"alpha": "org/alpha", "beta": "org/beta"}, serving="alpha", hold=hold) for h in HOSTS}
    ops = Operations(
        catalog,
        lambda name: (_ for _ in ()).throw(AssertionError(f"the controller touched {name}")),
        store=FakeStateStore(),
    )
    agent = Agent(catalog, ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=FakeClock())
    agent.controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=lambda host: boxes[host.name]
    )
    server = start(agent)
    assert server is not None
    yield Ctl(agent, server, boxes, hold, path)
    hold.set()
    server.close()
    public.rmdir()


def sse(path: str, url: str) -> Iterator[dict[str, Any]]:
    """Each message of an SSE stream of the dashboard, as JSON."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(path)
    s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    with s, s.makefile("rb") as stream:
        for line in stream:
            if line.startswith(b"data: "):
                yield dict(json.loads(line[6:]))


def until(messages: Iterator[dict[str, Any]], ok: Callable[[dict[str, str]], bool]) -> dict[str, str]:
    """The first message whose sections satisfy ``ok``, within 60 s (else the last one seen, in the error)."""
    deadline, last = time.monotonic() + 60, None
    for msg in messages:
        if ok(msg["html"]):
            return dict(msg["html"])
        last = msg
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no such message; the last: {last}")


def test_the_fleet_page_lists_each_box_of_the_group_with_what_it_serves(ctl: Ctl) -> None:
    """Each box's own agent answers: every box of the group serves alpha, healthy, idle; no rollout yet."""
    status, _, body = ctl.get("/fleet")
    assert status == 200 and 'id="group-inference"' in body
    for h in HOSTS:
        assert f'<tr data-host="{h}" data-reachable="true">' in body
    boxes = {b["host"]: b for b in ctl.fleet()["boxes"]}
    assert {(b["serving"], b["health"], b["activity"]) for b in boxes.values()} == {("alpha", "healthy", "idle")}
    assert "no rollout recorded for this group" in body


def test_a_controller_that_serves_nothing_itself_opens_on_the_fleet_page(ctl: Ctl) -> None:
    """/ of an agent whose every host is a group's box sends the browser to /fleet."""
    status, headers, _ = ctl.get("/")
    assert status == 303 and headers["Location"] == "/fleet"


def test_an_agent_without_groups_has_no_fleet_page(tmp_path: Path) -> None:
    """No [groups.*]: /fleet, /api/fleet and /fleet/events are 404, and the box page links no fleet."""
    from .conftest import OpsWorld

    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(tmp_path / "d.sock")})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    try:
        ctl = Ctl(agent, server, {}, threading.Event(), str(tmp_path / "d.sock"))
        assert [ctl.get(p)[0] for p in ("/fleet", "/api/fleet", "/fleet/events")] == [404, 404, 404]
        assert 'href="/fleet"' not in ctl.get("/")[2]
    finally:
        server.close()


def test_an_unreachable_box_is_shown_naming_why(ctl: Ctl) -> None:
    """A box whose agent cannot be reached is a row that says so, with the reason; the others still show."""
    ctl.boxes["h3"].unreachable = TransportError("host h3 (127.0.0.12:22): connection refused")
    rows = {b["host"]: b for b in ctl.fleet()["boxes"]}
    assert not rows["h3"]["reachable"] and "connection refused" in rows["h3"]["error"]
    assert rows["h1"]["serving"] == "alpha"


def test_a_box_that_dropped_off_and_came_back_shows_again_on_the_next_refresh(ctl: Ctl) -> None:
    """h3's connection dies (it stays dead, as SSH does): its row names why; once h3 answers again the
    page connects anew and shows it serving, without waiting for the page to go idle."""
    assert all(b["reachable"] for b in ctl.fleet()["boxes"])
    ctl.boxes["h3"].lose()
    wait_for(
        lambda: {b["host"]: b for b in ctl.fleet()["boxes"]}["h3"],
        lambda r: not r["reachable"],
        timeout=30,
        what="h3 to read unreachable",
    )
    ctl.boxes["h3"].come_back()
    row = wait_for(
        lambda: {b["host"]: b for b in ctl.fleet()["boxes"]}["h3"],
        lambda r: r["reachable"],
        timeout=30,
        what="h3 to read reachable again",
    )
    assert row["serving"] == "alpha"


def test_the_rollout_shows_batch_by_batch_as_it_goes(ctl: Ctl) -> None:
    """Through SSE: the canary switching alone (its phase from the box's progress), then every batch
    done and the boxes serving beta; no page reload, no second source (the controller's own answers)."""
    messages = sse(ctl.path, "/fleet/events")
    assert "no rollout recorded" in next(messages)["html"]["g0-rollout"]
    rid = ctl.agent.controller.start(RolloutStartArgs(model="beta"), "alice@10.0.0.7")["id"]
    held = until(
        messages,
        lambda html: (
            'data-host="h1" data-state="switching"' in html["g0-rollout"]
            and "switching (starting)" in html["g0-rollout"]
        ),
    )
    assert 'data-batch="0" data-state="switching"' in held["g0-rollout"]
    assert 'data-batch="1" data-state="pending"' in held["g0-rollout"]
    assert "running: canary switching" in held["g0-rollout"] and "alice@10.0.0.7" in held["g0-rollout"]
    ctl.hold.set()
    done = until(
        messages,
        lambda html: (
            'data-status="succeeded"' in html["g0-rollout"]
            and html["g0-boxes"].count('<td class="serving">beta</td>') == 4
        ),
    )
    assert all(f'data-batch="{i}" data-state="done"' in done["g0-rollout"] for i in (0, 1, 2))
    assert f"rollout #{rid}" in done["g0-rollout"]


def test_an_abort_asked_for_mid_batch_shows_before_the_rollout_stops(ctl: Ctl) -> None:
    """An abort requested while the canary switches: the rollout reads "abort requested" until the
    batch ends, then aborted with the later batches never started."""
    rid = ctl.agent.controller.start(RolloutStartArgs(model="beta"), "alice")["id"]
    ctl.agent.controller.abort(rid, rollback_all=False)
    ro = ctl.fleet()["rollout"]
    assert ro["abort_requested"] and "abort requested: stops after this batch" in ro["label"]
    ctl.hold.set()
    messages = sse(ctl.path, "/fleet/events")
    done = until(messages, lambda html: 'data-status="aborted"' in html["g0-rollout"])
    assert 'data-batch="0" data-state="done"' in done["g0-rollout"]
    assert 'data-batch="1" data-state="pending"' in done["g0-rollout"]


def test_the_group_shows_its_last_few_ended_rollouts_under_the_newest(ctl: Ctl) -> None:
    """Seven ended rollouts of the group: the newest is the group's rollout, the five before it are
    listed as earlier ones (newest first) on /api/fleet and the page; the oldest is left out."""
    store = ctl.agent.controller.store
    for _ in range(7):
        rid = store.create("beta", "inference", Policy(), "health", [("h1",)], 4242)
        store.finish(rid, RolloutStatus.SUCCEEDED, None, 1.0)
    group = ctl.fleet()
    assert group["rollout"]["id"] == 7 and [o["id"] for o in group["older"]] == [6, 5, 4, 3, 2]
    _, _, body = ctl.get("/fleet")
    assert "earlier: #6 beta succeeded · #5" in body and "#1 beta" not in body


@pytest.mark.parametrize("url", ["/fleet", "/api/fleet", "/fleet/events"])
def test_a_user_outside_the_socket_group_gets_403_on_the_fleet_pages(ctl: Ctl, url: str) -> None:
    """The fleet pages take the socket's authorization too: uid 65534 in no group gets 403, no box is asked."""
    reply = as_user(ctl.path, url=url)
    assert reply.startswith("HTTP/1.1 403") and "may not use the dashboard" in reply and "<table" not in reply
    assert all(b.open_channels == 0 and b.peak_channels == 0 for b in ctl.boxes.values())


def test_batches_name_the_canary_and_count_the_rest_from_one() -> None:
    """With a canary, batch 0 is "canary" and the next ones batch 1, 2; without, they count from 1."""
    hosts = [{"host": h, "batch": b, "state": "pending"} for h, b in (("h1", 0), ("h2", 1), ("h3", 1))]
    summary = {"rollout": {"id": 1, "status": "running", "canary": 1, "controller": {"alive": True}}, "hosts": hosts}
    view = fv.rollout_view(summary, abort_requested=False, live={})
    assert [b["name"] for b in view["batches"]] == ["canary", "batch 1"]
    assert view["label"] == "running: between batches (next: canary)"
    summary["rollout"]["canary"] = 0
    assert [b["name"] for b in fv.rollout_view(summary, abort_requested=False, live={})["batches"]] == [
        "batch 1",
        "batch 2",
    ]


def test_a_batch_with_a_failed_host_reads_failed() -> None:
    """Every host ended and one failed: the batch is failed; all switched: done; one switching: switching."""
    assert fv.batch_state(["switched", "failed"]) == "failed"
    assert fv.batch_state(["switched", "switched"]) == "done"
    assert fv.batch_state(["switched", "switching"]) == "switching"
    assert fv.batch_state(["pending", "staged"]) == "pending"


def test_a_group_box_reached_over_ssh_is_not_the_controllers_own_host() -> None:
    """own_hosts: a group's boxes over SSH are their own agents'; the controller's own box (local) and a
    host in no group stay on its box page."""
    hosts = {
        "h1": {"transport": "local", "address": "127.0.0.10"},
        "h2": {"address": "127.0.0.11"},
        "solo": {"address": "127.0.0.12"},
    }
    cat = make_catalog(
        hosts=hosts,
        groups={"inference": {"hosts": ["h1", "h2"]}},
        models={
            "beta": {"repo": "org/beta", "group": "inference", "gpus": [0], "port": 8001},
            "own": {"repo": "org/own", "host": "solo", "gpus": [0], "port": 8002},
        },
    )
    assert fv.own_hosts(cat) == ["h1", "solo"]


def test_a_box_whose_switch_stopped_its_model_reads_down_not_unhealthy() -> None:
    """The record still names alpha while the switch to beta starts: the box is down for the switch, and
    says its phase; before anything stopped (staging) alpha's health stands."""
    status = {
        "h1": {
            "serving": {"model": "alpha", "revision": 1, "healthy": False},
            "running": [{"model": "beta", "phase": "starting"}],
        },
        "h2": {
            "serving": {"model": "alpha", "revision": 1, "healthy": True},
            "running": [{"model": "beta", "phase": "staging"}],
        },
    }
    rows = {r["host"]: r for r in fv.box_rows(["h1", "h2"], status, {})}
    assert (rows["h1"]["health"], rows["h1"]["activity"]) == ("down: switching", "switching (starting)")
    assert (rows["h2"]["health"], rows["h2"]["activity"]) == ("healthy", "switching (staging)")


def test_stage_progress_changes_nothing_shown_so_it_reads_nothing() -> None:
    """A rollout's stage_progress (many a second) leaves the view as it was; a phase event changes it."""
    state: dict[str, dict[str, Any]] = {}
    assert not fv.live_update(state, "stage_progress", {"group_host": "h1", "bytes": 10})
    assert fv.live_update(state, "phase", {"group_host": "h1", "phase": "starting", "revision": 2, "model": "b"})
    assert state["h1"]["phase"] == "starting"
    assert not fv.live_update(state, "phase", {"group_host": "h1", "phase": "starting", "revision": 2, "model": "b"})


class CountingBox(SimulatedBox):
    """A simulated box that counts the channels opened to it (one per request)."""

    opened = 0

    def open_stream(self) -> Any:
        self.opened += 1
        return super().open_stream()


def test_the_boxes_are_asked_at_most_once_per_refresh_and_let_go_when_no_page_reads(tmp_path: Path) -> None:
    """Two reads within refresh_s ask each box once (status and history); a minute with no reader closes
    the controller's connections to the boxes."""
    path = str(tmp_path / "d.sock")
    catalog = fleet_catalog(tmp_path / "state", path)
    boxes = {h: CountingBox(h, {"alpha": "org/alpha"}, serving="alpha") for h in HOSTS}
    ops = Operations(catalog, lambda name: (_ for _ in ()).throw(AssertionError(name)), store=FakeStateStore())
    agent = Agent(catalog, ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=FakeClock())
    agent.controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=lambda host: boxes[host.name]
    )
    from orchestrator.dashboard.live import Live

    live = Live(agent, 60.0, lambda host: [])
    live.fleet_view()
    live.fleet_view()
    assert [b.opened for b in boxes.values()] == [2, 2, 2, 2]
    live.fleet.close_idle(live.fleet.last_read + 30)
    assert not any(b.closed for b in boxes.values())
    live.fleet.close_idle(live.fleet.last_read + 61)
    assert all(b.closed for b in boxes.values())


def test_a_controller_that_is_also_a_box_shows_its_own_box_and_links_the_fleet(tmp_path: Path) -> None:
    """h1 is the controller's own box (local) and a member of the group: / shows h1 only (h2's agent owns
    h2), with a link to the fleet page, which lists both boxes."""
    from orchestrator.testing import FakeHost, FakeWeights

    hosts = {
        "h1": {"transport": "local", "address": "127.0.0.10", "gpus": 8, "gpu_memory_gib": 96},
        "h2": {"transport": "ssh", "address": "127.0.0.11", "gpus": 8, "gpu_memory_gib": 96},
    }
    catalog = make_catalog(
        state_dir=str(tmp_path / "state"),
        hosts=hosts,
        dashboard={"socket": str(tmp_path / "d.sock")},
        groups={"inference": {"hosts": ["h1", "h2"]}},
        models={
            "beta": {
                "repo": "org/beta",
                "group": "inference",
                "gpus": [0, 1, 2, 3],
                "tensor_parallel": 4,
                "port": 8001,
                "source": "none",
            }
        },
    )
    box = FakeHost(name="h1")
    ports = box.ports(catalog.hosts["h1"], FakeWeights())
    ops = Operations(
        catalog,
        lambda name: ports if name == "h1" else (_ for _ in ()).throw(AssertionError(name)),
        store=FakeStateStore(),
    )
    agent = Agent(catalog, ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=FakeClock())
    sims = {h: SimulatedBox(h, {"beta": "org/beta"}, serving="beta") for h in ("h1", "h2")}
    agent.controller = FleetController(
        lambda: catalog, clock=FakeClock(), pid=4242, store=FakeRolloutStore(), connect=lambda host: sims[host.name]
    )
    server = start(agent)
    assert server is not None
    try:
        ctl = Ctl(agent, server, sims, threading.Event(), str(tmp_path / "d.sock"))
        status, _, body = ctl.get("/")
        assert status == 200 and '<a href="/fleet">the fleet page</a>' in body and 'id="fleet-link"' in body
        assert 'id="host-h1"' in body and 'id="host-h2"' not in body
        assert [b["host"] for b in ctl.fleet()["boxes"]] == ["h1", "h2"]
    finally:
        server.close()


def test_each_box_of_the_fleet_page_links_to_its_own_page(ctl: Ctl) -> None:
    """The boxes table links each box to a page of its own: what its agent serves, each group model's state
    on it and its history, with the command that opens its full dashboard; an unknown box is 404."""
    body = ctl.get("/fleet")[2]
    assert all(f'<a href="/fleet/box/{h}" class="box-link">{h}</a>' in body for h in HOSTS)
    status, _, page = ctl.get("/fleet/box/h2")
    assert status == 200 and 'data-box="h2"' in page
    assert "serving alpha (revision 1)" in page and 'data-model="beta" data-state="stopped"' in page
    assert 'data-revision="1" data-outcome="active"' in page and "orchestrator --host h2 dashboard" in page
    assert ctl.get("/fleet/box/h9")[0] == 404


def test_a_box_page_of_an_unreachable_box_says_why(ctl: Ctl) -> None:
    """A box whose agent cannot be reached: its page names the reason instead of an error page."""
    ctl.boxes["h3"].unreachable = TransportError("host h3 (127.0.0.12:22): connection refused")
    status, _, page = ctl.get("/fleet/box/h3")
    assert status == 200 and "unreachable: host h3 (127.0.0.12:22): connection refused" in page
