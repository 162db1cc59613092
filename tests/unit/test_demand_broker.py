"""The agent's broker of models on demand (agent/demand.py) on fake ports: held requests wake or start
their model as a normal switch, are turned away by the policy, are abandoned when nobody waits, and
idle models go to sleep and stop."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent.demand import Broker, Ticket
from orchestrator.agent.demand_view import PEAK_S, SESSIONS_TTL_S
from orchestrator.agent.metrics import Metrics
from orchestrator.agent.server import Jobs
from orchestrator.core.haproxy_cli import Sessions
from orchestrator.core.proxy_move import runtime_move
from orchestrator.deploy.operations import Operations
from orchestrator.testing import (
    FakeClock,
    FakeHost,
    FakeProxy,
    FakeResidencyStore,
    FakeStateStore,
    FakeWeights,
)

from .conftest import make_catalog

SHARED = {"tensor_parallel": 4, "gpus": [0, 1, 2, 3], "sleep": "level1", "on_demand": True}


class DemandWorld:
    """An agent's broker over one fake host with the proxy on: a and b share GPUs 0-3, c has 4-7."""

    def __init__(self, state_dir: Path, models: dict[str, dict[str, Any]] | None = None, **demand: Any) -> None:
        self.catalog = make_catalog(
            state_dir=str(state_dir),
            proxy={"enabled": True, "port": 9000},
            demand={"batch_wait_s": 1.0, **demand},
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
            models=models
            or {
                "a": {"repo": "org/a", "port": 8001, **SHARED},
                "b": {"repo": "org/b", "port": 8002, "served_name": "bee", **SHARED},
                "c": {"repo": "org/c", "port": 8003, "tensor_parallel": 4, "gpus": [4, 5, 6, 7], "on_demand": True},
            },
        )
        self.clock = FakeClock()
        self.host = FakeHost(name="box", clock=self.clock)
        self.proxy = FakeProxy()
        self.store = FakeStateStore()
        ports = self.host.ports(self.catalog.hosts["box"], FakeWeights())
        ports.proxy = self.proxy
        self.ports = ports
        self.ops = Operations(self.catalog, lambda name: ports, store=self.store, residency=FakeResidencyStore())
        self.jobs = Jobs(self.ops, lambda job: None)
        self.metrics = Metrics(None)
        self.stopping = threading.Event()
        self.broker = Broker(self, self.clock)

    def run_swap(self) -> dict[str, Any]:
        """One pass that starts a swap, the swap to its end, and the pass that answers its requests."""
        self.broker.tick()
        swap = self.broker.running.get("box")
        assert swap is not None and swap.job is not None, "no swap started"
        assert swap.job.done.wait(30)
        self.broker.tick()
        return (swap.job.result or {}).get("result") or swap.job.result or {}

    def serving(self) -> list[str]:
        return sorted(d.model for d in self.store.serving_set("box"))

    def states(self) -> dict[str, str]:
        return {m: r.state for m, r in self.ops.residency.residency("box").items()}

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def routed(config: str, port: int) -> bool:
    """Whether the proxy's config sends requests to the engine on ``port`` (a disabled server does not)."""
    return any(f":{port}" in line and "disabled" not in line for line in config.splitlines())


@pytest.fixture
def dw(tmp_path: Path) -> DemandWorld:
    return DemandWorld(tmp_path)


def test_an_unknown_name_is_404_and_starts_nothing(dw: DemandWorld) -> None:
    """A name no model serves: 404 model-not-found at once, no job, no unit touched."""
    ticket = dw.broker.open("gpt-4")
    assert ticket.answer == {"status": 404, "message": "The model `gpt-4` does not exist.", "retry_after_s": None}
    dw.broker.tick()
    assert dw.jobs.running == {} and dw.host.calls == []


def test_a_request_for_a_stopped_model_starts_it_as_a_demand_switch(dw: DemandWorld) -> None:
    """Stopped a: held, started by a switch with trigger demand:a, then ready; history has the waits."""
    ticket = dw.broker.open("a")
    assert ticket.answer is None
    result = dw.run_swap()
    assert result["outcome"] == "active" and ticket.answer == {"ready": True}
    assert dw.store.history("box", 5)[0].trigger == "demand:a"
    row = dw.ops.history("box")[0]
    assert row["demand"]["requests"] == 1 and row["demand"]["cold"] is True and len(row["demand"]["waits_s"]) == 1


def test_the_served_name_finds_its_model(dw: DemandWorld) -> None:
    """The proxy asks by the request's model: b's served name "bee"."""
    dw.broker.open("bee")
    dw.run_swap()
    assert dw.serving() == ["b"]


def test_a_request_for_a_sleeper_wakes_it_warm(dw: DemandWorld) -> None:
    """a asleep (b took its GPUs): a request for a wakes it, b sleeps; no cold start of a."""
    dw.ops.switch("a")
    dw.ops.switch("b")
    dw.host.calls.clear()
    ticket = dw.broker.open("a")
    dw.run_swap()
    assert ticket.answer == {"ready": True}
    assert "wake vllm-a.service" in dw.host.calls and "start vllm-a.service" not in dw.host.calls
    assert dw.states() == {"a": "serving", "b": "asleep"}


def test_a_request_for_a_serving_model_is_ready_at_once(dw: DemandWorld) -> None:
    """a serves: ready without a swap."""
    dw.ops.switch("a")
    assert dw.broker.open("a").answer == {"ready": True}
    assert dw.broker.running == {}


def test_models_on_disjoint_gpus_stay_awake_together(dw: DemandWorld) -> None:
    """a serves on GPUs 0-3; a request for c (4-7) starts it beside a."""
    dw.ops.switch("a")
    dw.broker.open("c")
    dw.run_swap()
    assert dw.serving() == ["a", "c"]


def test_beyond_the_queue_limit_429_with_retry_after(tmp_path: Path) -> None:
    """queue_limit 2: the third held request for a is 429 with Retry-After, counted in the metrics."""
    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "queue_limit": 2}})
    first, second, third = dw.broker.open("a"), dw.broker.open("a"), dw.broker.open("a")
    assert first.answer is None and second.answer is None
    assert third.answer is not None and third.answer["status"] == 429 and third.answer["retry_after_s"] >= 1
    assert dw.metric("orchestrator_demand_rejected_total", model="a", status="429") == 1


def test_a_cold_start_nobody_waits_for_is_abandoned_and_its_memory_freed(dw: DemandWorld) -> None:
    """a loads; its only request goes away: the switch is abandoned (rolled back), the unit stopped,
    its GPUs hold nothing of it, and the record says why."""
    dw.host.behaviours["vllm-a.service"] = "never_ready"
    ticket = dw.broker.open("a")
    gone: list[Ticket] = []

    def client_goes_away() -> None:
        if not gone and "start vllm-a.service" in dw.host.calls:
            gone.append(ticket)
            dw.broker.cancel(ticket)

    dw.clock.on_sleep.append(client_goes_away)
    result = dw.run_swap()
    assert gone and result["outcome"] == "rolled_back"
    assert "abandoned: every request waiting for a was cancelled (1)" in (result.get("error") or "")
    assert "vllm-a.service" not in dw.host.active_units() and dw.serving() == []
    assert not [p for p in dw.ports.gpus.snapshot().processes if p.gpu_index in (0, 1, 2, 3)]


def test_a_cold_start_someone_still_waits_for_goes_on(dw: DemandWorld) -> None:
    """Two requests, one goes away: the start goes on and the other is served."""
    one, two = dw.broker.open("a"), dw.broker.open("a")
    dw.broker.cancel(one)
    dw.run_swap()
    assert two.answer == {"ready": True} and dw.serving() == ["a"]


def test_an_operators_operation_holds_precedence(dw: DemandWorld) -> None:
    """While an operator's job holds the box the held request waits; after it, the swap runs."""
    release = threading.Event()
    job = dw.jobs.submit("box", "switch", {"model": "c"}, lambda j: (release.wait(10), {"outcome": "active"})[1])
    ticket = dw.broker.open("a")
    dw.broker.tick()
    assert dw.broker.running == {} and ticket.answer is None
    assert dw.broker.snapshot()["queues"]["a"]["waiting"] == 1
    release.set()
    assert job.done.wait(10)
    dw.run_swap()
    assert ticket.answer == {"ready": True}


def test_an_operator_waits_for_a_running_demand_swap_then_wins(dw: DemandWorld) -> None:
    """yield_to waits for the on-demand switch and keeps new ones from starting until resume."""
    dw.broker.open("a")
    dw.broker.tick()
    dw.broker.yield_to("box", "switch b by alice", timeout_s=30)
    swap_job = dw.broker.running["box"].job
    assert swap_job is not None and swap_job.done.is_set()
    dw.broker.open("c")
    dw.broker.tick()
    assert dw.broker.running == {} and dw.broker.snapshot()["hosts"]["box"]["yielding_to"] == "switch b by alice"
    dw.broker.resume("box")
    dw.run_swap()
    assert "c" in dw.serving()


def test_a_request_held_back_past_its_deadline_is_429(tmp_path: Path) -> None:
    """The swap cap holds b's request until past its demand_deadline_s: 429 with Retry-After."""
    dw = DemandWorld(
        tmp_path,
        max_swaps_per_min=1,
        models={
            "a": {"repo": "org/a", "port": 8001, **SHARED},
            "b": {"repo": "org/b", "port": 8002, **SHARED, "demand_deadline_s": 5},
        },
    )
    dw.broker.open("b")
    dw.run_swap()
    dw.clock.sleep(3)  # b's requests were answered 3 s ago: no longer counted as in flight
    dw.broker.open("a")
    dw.run_swap()  # a displaces b: the one swap of this minute
    ticket = dw.broker.open("b")
    dw.broker.tick()
    assert dw.broker.running == {} and ticket.answer is None
    dw.clock.sleep(6)
    dw.broker.tick()
    assert ticket.answer is not None and ticket.answer["status"] == 429
    assert "max_swaps_per_min" in ticket.answer["message"] and ticket.answer["retry_after_s"] >= 1


def test_the_swap_cap_counts_the_swaps_made_before_the_agent_restarted(tmp_path: Path) -> None:
    """Cap 1: a displaces b, the agent restarts (a new broker over the same records): b's request
    waits for the cap, it does not swap again within the minute; after it, b's next request swaps."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=1)
    dw.broker.open("bee")
    dw.run_swap()
    dw.clock.sleep(3)
    dw.broker.open("a")
    dw.run_swap()  # a displaces b: the one swap of this minute
    dw.clock.sleep(5)
    dw.broker = Broker(dw, dw.clock)
    ticket = dw.broker.open("bee")
    dw.broker.tick()
    assert dw.broker.running == {} and ticket.answer is None
    assert dw.broker.snapshot()["hosts"]["box"]["swaps_last_min"] == 1
    dw.clock.sleep(56)  # past the minute since a's swap began
    dw.broker.open("bee")
    dw.run_swap()
    assert dw.serving() == ["b"]


def test_swaps_are_counted_per_kind(dw: DemandWorld) -> None:
    """A start on free GPUs is counted as not displacing."""
    dw.broker.open("a")
    dw.run_swap()
    assert dw.metric("orchestrator_demand_swaps_total", host="box", model="a", kind="start", displacing="false") == 1
    assert dw.metric("orchestrator_demand_wait_seconds_count", model="a", outcome="ready") == 1


def test_an_idle_model_sleeps_after_idle_sleep_s(tmp_path: Path) -> None:
    """a serves, its last request 60 s ago with idle_sleep_s 60: the idle loop puts it to sleep; the
    route leaves, the engine sleeps, an event says why."""
    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    dw.broker.idle_tick()
    assert dw.broker.idle_jobs == {}
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10) and (job.result or {}).get("result", {}).get("outcome") == "asleep"
    assert dw.states() == {"a": "asleep"} and dw.serving() == []
    assert not routed(dw.proxy.config or "", 8001)
    events = [e for e in dw.store.events(kind="demand_idle")]
    assert events and "idle_sleep_s 60" in events[0]["reason"]


def test_requests_in_flight_keep_a_model_awake(tmp_path: Path) -> None:
    """HAProxy counts a session on a's engine: not idle, however old its last request."""
    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    spec = dw.store.serving_set("box")[0].spec
    dw.proxy.counted[(spec.address, spec.port)] = Sessions(current=2, idle_s=0.0)
    dw.clock.sleep(600)
    dw.broker.idle_tick()
    assert dw.broker.idle_jobs == {} and dw.serving() == ["a"]


def test_a_sleeper_stops_after_idle_stop_s_and_its_gpus_are_free(tmp_path: Path) -> None:
    """Asleep a with idle_stop_s 300: stopped, nothing of it left on its GPUs."""
    dw = DemandWorld(
        tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60, "idle_stop_s": 300}}
    )
    dw.broker.open("a")
    dw.run_swap()
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    assert dw.broker.idle_jobs["box"].done.wait(10)
    dw.clock.sleep(300)
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10) and (job.result or {}).get("result", {}).get("outcome") == "stopped"
    assert dw.states() == {"a": "stopped"} and "vllm-a.service" not in dw.host.active_units()
    assert not dw.ports.gpus.snapshot().processes


def test_a_model_asleep_for_idleness_stops_idle_stop_s_after_its_last_request(tmp_path: Path) -> None:
    """idle_sleep_s 60, idle_stop_s 300: a sleeps 60 s after it came up for its one request, and stops
    300 s after that, not 300 s after it fell asleep (which came idle_sleep_s late)."""
    dw = DemandWorld(
        tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60, "idle_stop_s": 300}}
    )
    dw.broker.open("a")
    dw.run_swap()
    dw.broker.idle_tick()
    came_up = dw.clock.monotonic()
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    assert dw.broker.idle_jobs["box"].done.wait(10) and dw.states() == {"a": "asleep"}
    dw.clock.t = came_up + 301
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10) and (job.result or {}).get("result", {}).get("outcome") == "stopped"


def test_a_sleeper_displaced_by_a_serving_model_stops_after_idle_stop_s(tmp_path: Path) -> None:
    """b displaced a (same GPUs) and serves: a, asleep, stops after its idle_stop_s; b's engine on those
    GPUs is not a busy GPU for that stop, and b keeps serving."""
    dw = DemandWorld(
        tmp_path,
        models={
            "a": {"repo": "org/a", "port": 8001, **SHARED, "idle_stop_s": 300},
            "b": {"repo": "org/b", "port": 8002, **SHARED},
        },
    )
    dw.broker.open("a")
    dw.run_swap()
    dw.clock.sleep(3)
    dw.broker.open("b")
    dw.run_swap()
    assert dw.states() == {"a": "asleep", "b": "serving"}
    dw.clock.sleep(301)
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10) and (job.result or {}).get("result", {}).get("outcome") == "stopped", job.result
    assert dw.states() == {"a": "stopped", "b": "serving"} and dw.serving() == ["b"]


def test_a_request_after_an_idle_sleep_wakes_the_model(tmp_path: Path) -> None:
    """Slept for idleness, a is woken warm by its next request."""
    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    assert dw.broker.idle_jobs["box"].done.wait(10)
    dw.host.calls.clear()
    ticket = dw.broker.open("a")
    dw.run_swap()
    assert ticket.answer == {"ready": True} and "wake vllm-a.service" in dw.host.calls


def test_status_shows_the_queue_per_model(dw: DemandWorld) -> None:
    """Two held for a, one for c: the snapshot counts them."""
    dw.broker.open("a")
    dw.broker.open("a")
    dw.broker.open("c")
    queues = dw.broker.snapshot()["queues"]
    assert (queues["a"]["waiting"], queues["c"]["waiting"]) == (2, 1)


def test_status_text_shows_the_queue_and_the_swap(dw: DemandWorld) -> None:
    """`status` prints one line per host: each model's held requests, the swaps of the last minute."""
    import io

    from rich.console import Console

    from orchestrator.cli.deploy_cmds import print_status

    dw.broker.open("a")
    dw.broker.open("a")
    out = io.StringIO()
    print_status(
        Console(file=out, width=200), {**dw.ops.status("box", probe=False), "agent": {"demand": dw.broker.snapshot()}}
    )
    assert "on demand: a 2 waiting (oldest 0.0 s); 0 swaps in the last minute" in out.getvalue()


def test_a_tune_run_holds_precedence_between_its_switches(dw: DemandWorld) -> None:
    """While a tune run holds its lock (a real flock) no on-demand swap starts; after it, one does."""
    from orchestrator.deploy.locks import activity_lock

    ticket = dw.broker.open("a")
    with activity_lock(dw.catalog.state_dir, "box", "tune", "a tune of a is running"):
        dw.broker.tick()
        assert dw.broker.running == {} and ticket.answer is None
    dw.run_swap()
    assert ticket.answer == {"ready": True}


def test_a_bench_holds_precedence_over_a_swap(dw: DemandWorld) -> None:
    """While `bench` holds its lock (a real flock) no on-demand swap starts; after it, one does."""
    from orchestrator.deploy.locks import activity_lock

    ticket = dw.broker.open("a")
    with activity_lock(dw.catalog.state_dir, "box", "bench", "a bench of a is running"):
        dw.broker.tick()
        assert dw.broker.running == {} and ticket.answer is None
        assert dw.broker.snapshot()["hosts"]["box"]["busy"].startswith("a bench of a is running since ")
    dw.run_swap()
    assert ticket.answer == {"ready": True}


def test_a_model_under_bench_is_not_idle(tmp_path: Path) -> None:
    """A bench's load goes to the engine, not through HAProxy: its lock keeps the idle loop off the model."""
    from orchestrator.deploy.locks import activity_lock

    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    dw.clock.sleep(61)
    with activity_lock(dw.catalog.state_dir, "box", "bench", "a bench of a is running"):
        dw.broker.idle_tick()
        assert dw.broker.idle_jobs == {} and dw.serving() == ["a"]


def test_a_model_with_more_requests_in_flight_keeps_its_gpus(dw: DemandWorld) -> None:
    """a serves 3 requests (HAProxy's scur): a single request for b is 429 at once, nothing swaps."""
    dw.ops.switch("a")
    spec = dw.store.serving_set("box")[0].spec
    dw.proxy.counted[(spec.address, spec.port)] = Sessions(current=3, idle_s=0.0, total=3)
    dw.broker.tick()
    ticket = dw.broker.open("bee")
    dw.broker.tick()
    assert ticket.answer is not None and ticket.answer["status"] == 429
    assert "a is asked more" in ticket.answer["message"]
    assert dw.broker.snapshot()["queues"] == {} and dw.serving() == ["a"]


def test_an_abandoned_cold_start_gives_the_displaced_model_back(dw: DemandWorld) -> None:
    """b served on a's GPUs and slept for a's cold start; a is abandoned: b serves again."""
    dw.ops.switch("b")
    dw.host.behaviours["vllm-a.service"] = "never_ready"
    ticket = dw.broker.open("a")
    dw.clock.on_sleep.append(lambda: "start vllm-a.service" in dw.host.calls and dw.broker.cancel(ticket))
    result = dw.run_swap()
    assert result["outcome"] == "rolled_back" and "abandoned" in (result.get("error") or "")
    assert dw.serving() == ["b"] and "vllm-a.service" not in dw.host.active_units()


def test_a_host_lock_held_elsewhere_keeps_the_requests_waiting(dw: DemandWorld) -> None:
    """A CLI without the agent holds the host's lock: the swap is refused Busy, the request keeps
    waiting (no 503), and once the lock is free the swap runs."""
    from orchestrator.deploy.locks import host_lock

    ticket = dw.broker.open("a")
    with host_lock(dw.catalog.state_dir, "box", "a CLI's switch"):
        dw.broker.tick()
        swap = dw.broker.running["box"]
        assert swap.job is not None and swap.job.done.wait(10)
        dw.broker.tick()
        assert ticket.answer is None and dw.broker.running == {} and dw.store.events(kind="demand") == []
    dw.clock.sleep(1.5)
    dw.run_swap()
    assert ticket.answer == {"ready": True}


def test_nothing_starts_while_the_agent_stops(dw: DemandWorld) -> None:
    """SIGTERM: held requests wait, no new switch begins."""
    dw.broker.open("a")
    dw.stopping.set()
    dw.broker.tick()
    assert dw.broker.running == {} and dw.jobs.running == {}


def test_a_request_for_a_serving_model_waits_while_a_switch_runs(dw: DemandWorld) -> None:
    """a serves but an operator's switch runs (it may be taking a down): held, not ready, until it ends."""
    dw.ops.switch("a")
    release = threading.Event()
    job = dw.jobs.submit("box", "switch", {"model": "c"}, lambda j: (release.wait(10), {"outcome": "active"})[1])
    ticket = dw.broker.open("a")
    dw.broker.tick()
    assert ticket.answer is None
    release.set()
    assert job.done.wait(10)
    dw.broker.tick()
    assert ticket.answer == {"ready": True} and dw.broker.running == {}


def test_a_request_past_its_deadline_waits_for_its_own_running_swap(tmp_path: Path) -> None:
    """b asleep (wake deadline 5 s: held 6 s): its swap runs longer (a slow host); the request is not
    failed at 6 s but waits for the swap, up to the cold deadline the proxy holds it for."""
    dw = DemandWorld(
        tmp_path,
        models={
            "a": {"repo": "org/a", "port": 8001, **SHARED},
            "b": {"repo": "org/b", "port": 8002, **SHARED, "wake_deadline_s": 5},
        },
    )
    dw.ops.switch("b")
    dw.ops.switch("a")
    release, blocked = threading.Event(), threading.Event()

    def slow_drain() -> None:  # the swap's drain polls: hold it there
        if not release.is_set():
            blocked.set()
            release.wait(30)

    ticket = dw.broker.open("b")
    dw.proxy.busy = 3
    dw.clock.on_sleep.append(slow_drain)
    dw.broker.tick()
    assert blocked.wait(30)
    dw.clock.t += 10  # past its 6 s while the swap runs
    dw.broker.tick()
    assert ticket.answer is None
    release.set()
    swap = dw.broker.running["box"]
    assert swap.job is not None and swap.job.done.wait(30)
    assert ticket.answer == {"ready": True}


def test_requests_just_routed_count_as_in_flight(dw: DemandWorld) -> None:
    """A swap to b answered 3 held requests ready; before HAProxy counts them a lone request for a is
    429; a second later (HAProxy's figures then count) it is held."""
    for _ in range(3):
        dw.broker.open("bee")
    dw.run_swap()
    ticket = dw.broker.open("a")
    assert ticket.answer is not None and ticket.answer["status"] == 429
    assert "b is asked more" in ticket.answer["message"]
    dw.clock.sleep(1.5)
    assert dw.broker.open("a").answer is None


def test_the_peak_in_flight_holds_for_peak_s_however_many_requests_are_turned_away(dw: DemandWorld) -> None:
    """a serves 3 closed-loop clients and one reading counts 2 (a client between two requests): a lone
    request for b is 429 for PEAK_S after the reading of 3, however many were turned away since (a flood
    once pushed that reading out of a bounded list within a third of a second and let b take the GPUs)."""
    dw.ops.switch("a")
    spec = dw.store.serving_set("box")[0].spec
    dw.proxy.counted[(spec.address, spec.port)] = Sessions(current=3, idle_s=0.0, total=3)
    dw.broker.idle_tick()  # a reading of HAProxy's sessions
    dw.clock.sleep(SESSIONS_TTL_S)
    dw.proxy.counted[(spec.address, spec.port)] = Sessions(current=2, idle_s=0.0, total=4)
    for _ in range(1000):
        dw.clock.t += 0.5 / 1000  # turned away at 2000 a second, as clients that ignore Retry-After are
        ticket = dw.broker.open("bee")
        assert ticket.answer is not None and ticket.answer["status"] == 429, ticket.answer
    dw.clock.sleep(PEAK_S)  # the reading of 3 is older than PEAK_S now: a is asked by 2, b may wait for it
    assert dw.broker.open("bee").answer is None


def test_a_request_after_an_abandoned_start_waits_for_the_next_decision(dw: DemandWorld) -> None:
    """a's only request went away and its start was abandoned; one that came meanwhile is not failed
    with the abandoned switch's 503 but starts a again."""
    dw.host.behaviours["vllm-a.service"] = "never_ready"
    first = dw.broker.open("a")
    late: list[Ticket] = []

    dw.clock.on_sleep.append(lambda: "start vllm-a.service" in dw.host.calls and dw.broker.cancel(first))

    def arrives_during_the_rollback(dep: Any) -> None:
        if dep.phase.value == "rolling_back" and not late:
            late.append(dw.broker.open("a"))

    dw.ops.before_step = arrives_during_the_rollback
    result = dw.run_swap()
    assert result["outcome"] == "rolled_back" and late and late[0].answer is None
    dw.clock.on_sleep.clear()
    dw.ops.before_step = None
    dw.host.behaviours.pop("vllm-a.service")
    dw.run_swap()
    assert late[0].answer == {"ready": True}


def test_a_failed_sessions_reading_keeps_the_last_one(dw: DemandWorld) -> None:
    """HAProxy's master does not answer for a moment (a reload): a keeps counting what it had."""
    from orchestrator.errors import ProxyError

    dw.ops.switch("a")
    spec = dw.store.serving_set("box")[0].spec
    dw.proxy.counted[(spec.address, spec.port)] = Sessions(current=4, idle_s=0.0, total=4)
    dw.broker.idle_tick()

    def gone(engines: Any) -> Any:
        raise ProxyError("no master")

    dw.proxy.sessions = gone  # type: ignore[method-assign]
    dw.clock.sleep(2)
    ticket = dw.broker.open("bee")
    assert ticket.answer is not None and ticket.answer["status"] == 429


def test_an_idle_sleep_that_keeps_its_memory_stops_the_engine_instead(tmp_path: Path) -> None:
    """a's sleep answers 200 but keeps its GPU memory: the idle loop stops it, its GPUs end free, the
    event names the sleep's failure."""
    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    dw.host.engine_behaviours["vllm-a.service"] = "leaky_sleep"
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10) and (job.result or {}).get("result", {}).get("outcome") == "stopped"
    assert dw.states() == {"a": "stopped"} and not dw.ports.gpus.snapshot().processes
    event = dw.store.events(kind="demand_idle")[0]
    assert event["outcome"] == "stopped" and "still holds" in event["sleep_failed"]


def _a_engine(dw: DemandWorld) -> tuple[str, int]:
    spec = next(d.spec for d in dw.store.serving_set("box") if d.model == "a")
    return spec.address, spec.port


def test_a_lone_client_alternating_two_models_waits_for_no_batching_bound(tmp_path: Path) -> None:
    """a served a request a moment ago (HAProxy's peak 1) and has none in flight when b's comes: b's
    swap starts at the first pass, not batch_wait_s later."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    dw.proxy.counted[_a_engine(dw)] = Sessions(current=1, idle_s=0.0, total=1)
    dw.broker.idle_tick()
    dw.proxy.counted[_a_engine(dw)] = Sessions(current=0, idle_s=0.0, total=1)
    dw.clock.sleep(0.3)
    ticket = dw.broker.open("bee")
    dw.run_swap()
    assert ticket.answer == {"ready": True} and dw.clock.monotonic() - ticket.arrived < 1.0


def test_requests_in_flight_now_on_the_displaced_model_batch_until_it_serves_none(tmp_path: Path) -> None:
    """a serves one request as b's comes: no swap; once HAProxy counts none, b's swap starts, before
    batch_wait_s (1 s) has passed."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    dw.proxy.counted[_a_engine(dw)] = Sessions(current=1, idle_s=0.0, total=1)
    ticket = dw.broker.open("bee")
    dw.broker.tick()
    assert dw.broker.running == {}
    dw.proxy.counted[_a_engine(dw)] = Sessions(current=0, idle_s=0.0, total=1)
    dw.clock.sleep(0.3)
    dw.run_swap()
    assert ticket.answer == {"ready": True} and dw.clock.monotonic() - ticket.arrived < 1.0


def test_a_request_answered_ready_counts_in_flight_until_the_proxy_took_it(tmp_path: Path) -> None:
    """b's request was just answered ready: until the proxy takes it (and a reading comes after), a
    request for a is batched; then a's swap starts."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("a")
    first = dw.broker.open("bee")
    dw.run_swap()
    assert first.answer == {"ready": True}
    dw.clock.sleep(0.3)
    dw.broker.open("a")
    dw.broker.tick()
    assert dw.broker.running == {}
    dw.broker.taken(first)
    dw.clock.sleep(0.3)
    dw.broker.tick()
    assert dw.broker.running["box"].model == "a"


def test_held_requests_are_released_when_the_switch_enters_routing(tmp_path: Path) -> None:
    """Warm swap to b: its held request is answered ready as the switch enters routing (b checked awake),
    while the proxy's config does not route b yet; one that comes then is ready at once."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    ticket = dw.broker.open("bee")
    seen: list[tuple[Any, bool]] = []

    def at_routing(dep: Any) -> None:
        if dep.phase.value == "routing" and not seen:
            seen.append((ticket.answer, routed(dw.proxy.config or "", 8002)))
            seen.append((dw.broker.open("bee").answer, False))

    dw.ops.before_step = at_routing
    dw.run_swap()
    assert seen == [({"ready": True}, False), ({"ready": True}, False)]
    assert routed(dw.proxy.config or "", 8002)
    row = dw.ops.history("box", 1)[0]["demand"]
    assert row["requests"] == 1 and any(what == "released 1" for _, what in row["timeline_ms"])


def test_a_warm_swap_between_names_on_demand_moves_the_route_at_runtime(tmp_path: Path) -> None:
    """a and b both on demand: sleeping serves the config that routes neither through the runtime
    API (a move, no withdraw, no apply), the held request stays held; routing applies the one that
    routes b, which differs from it in server states alone (the adapter moves it at runtime too)."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    applied = len(dw.proxy.applied)
    dw.broker.open("bee")
    dw.run_swap()
    assert dw.proxy.withdraws == 0 and len(dw.proxy.moved) == 1
    neither = dw.proxy.moved[0]
    assert not routed(neither, _port(dw, "a")) and not routed(neither, _port(dw, "b"))
    assert len(dw.proxy.applied) == applied + 1 and routed(dw.proxy.applied[-1], _port(dw, "b"))
    assert runtime_move(neither, dw.proxy.applied[-1]) and dw.serving() == ["b"]


def _port(dw: DemandWorld, model: str) -> int:
    return dw.catalog.models[model].port


def test_a_warm_swap_on_demand_withdraws_the_displaced_engine_instead_of_reloading(tmp_path: Path) -> None:
    """No runtime move (the proxy refuses it): sleeping takes a's engine out of the running proxy (no
    apply until routing), waits for the requests it still serves there, then a sleeps; routing
    applies the config that routes b."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.proxy.can_move = False
    dw.ops.switch("b")
    dw.ops.switch("a")
    applied = len(dw.proxy.applied)
    engine = _a_engine(dw)
    polls: list[str] = []

    def finish_a() -> None:  # the drain polls: a's last request ends on its second poll
        polls.append("poll")
        if len(polls) == 2:
            dw.proxy.counted[engine] = Sessions(current=0, idle_s=0.0, total=1)

    phases: list[tuple[str, int]] = []

    def step(dep: Any) -> None:
        phases.append((dep.phase.value, len(dw.proxy.applied)))
        if dep.phase.value == "sleeping":  # a request for a is in flight as its route leaves
            dw.proxy.counted[engine] = Sessions(current=1, idle_s=0.0, total=1)
            dw.clock.on_sleep.append(finish_a)

    dw.ops.before_step = step
    dw.broker.open("bee")
    dw.run_swap()
    assert dw.proxy.withdraws == 1 and dict(phases)["waking"] == applied and dict(phases)["routing"] == applied
    assert len(dw.proxy.applied) == applied + 1 and routed(dw.proxy.applied[-1], 8002)
    assert len(polls) >= 2 and dw.states()["a"] == "asleep"


def test_a_proxy_that_cannot_withdraw_moves_the_route_by_a_reload(tmp_path: Path) -> None:
    """move and withdraw refused (the proxy does not run its last config): sleeping applies the route as before."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    dw.proxy.can_withdraw = dw.proxy.can_move = False
    applied = len(dw.proxy.applied)
    dw.broker.open("bee")
    dw.run_swap()
    assert dw.proxy.withdraws == 0 and routed(dw.proxy.applied[applied], 8002)
    assert dw.serving() == ["b"]


def test_requests_answered_ready_one_after_another_add_up_as_in_flight(dw: DemandWorld) -> None:
    """A swap to b released 3 held requests and a 4th was ready at once: until HAProxy counts them all
    four count for b, so a lone request for a is 429 (b is asked more)."""
    for _ in range(3):
        dw.broker.open("bee")
    dw.run_swap()
    assert dw.broker.open("bee").answer == {"ready": True}
    ticket = dw.broker.open("a")
    assert ticket.answer is not None and ticket.answer["status"] == 429 and "(4 requests" in ticket.answer["message"]


def test_a_switch_to_a_level1_sleeper_under_its_own_unit_probes_no_access(
    dw: DemandWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switch's own access probe (before it plans) is left out for a wake that starts nothing."""
    from orchestrator.deploy import planning

    probed: list[str] = []
    monkeypatch.setattr(planning, "check_access", lambda catalog, model, *a: probed.append(model))
    dw.ops.switch("b")
    dw.ops.switch("a")
    assert probed == ["b", "a"]
    dw.ops.switch("b")
    assert probed == ["b", "a"] and dw.serving() == ["b"]


def test_the_demand_pass_waits_only_until_the_bound_it_waits_for_ends(tmp_path: Path) -> None:
    """b's request is batched until 1 s after it came: 0.97 s later the next pass is due in 0.03 s, not 0.1."""
    dw = DemandWorld(tmp_path, max_swaps_per_min=600)
    dw.ops.switch("b")
    dw.ops.switch("a")
    dw.proxy.counted[_a_engine(dw)] = Sessions(current=1, idle_s=0.0, total=1)
    dw.broker.open("bee")
    dw.clock.sleep(0.97)
    assert dw.broker.tick() == pytest.approx(0.03) and dw.broker.running == {}


def test_a_job_that_ends_wakes_the_demand_loop(dw: DemandWorld) -> None:
    """The swap's job ends: the loop's next pass runs at once (requests behind it are decided then)."""
    dw.broker.open("a")
    dw.broker.wake.clear()
    dw.run_swap()
    assert dw.broker.wake.is_set()
