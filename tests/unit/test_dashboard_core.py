"""The dashboard's rows, shaped from the agent's own answers (pure, no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator import settings
from orchestrator.core import dashboard as view
from orchestrator.core.observed import GpuInfo, GpuProcess, GpuSnapshot
from orchestrator.errors import ConfigError

from .conftest import make_catalog


def _row(rid: int, model: str, phases: list[tuple[str, float | None]], at: float = 0.0) -> dict[str, object]:
    return {
        "id": rid,
        "revision": rid,
        "model": model,
        "outcome": "active",
        "created_at": at,
        "phases": [{"phase": p, "seconds": s} for p, s in phases],
    }


def test_gpu_rows_name_the_model_whose_unit_holds_each_pid() -> None:
    """A process in a model's unit is shown as that model; any other process as "not ours"."""
    snap = GpuSnapshot(
        (GpuInfo(0, "GPU-0", "H200", 143_771, 70_000), GpuInfo(1, "GPU-1", "H200", 143_771, 0)),
        (GpuProcess(4412, "VLLM::EngineCore", "GPU-0", 69_000, 0), GpuProcess(999, "python", "GPU-0", 1_000, 0)),
    )
    rows = view.gpu_rows(snap, {4412: "minimax-m25"})
    assert [(p["pid"], p["model"]) for p in rows[0]["processes"]] == [(4412, "minimax-m25"), (999, "not ours")]
    assert rows[0]["used_pct"] == 49 and rows[1]["processes"] == []


def test_model_rows_say_serving_switching_or_stopped() -> None:
    """Each catalog model of the host gets one state: the running switch's target says its phase."""
    cat = make_catalog()
    entry = {
        "serving": {"model": "alpha", "revision": 3, "unit": "vllm-alpha.service", "healthy": False},
        "running": [{"model": "gamma", "phase": "starting"}],
    }
    rows = {r["model"]: r for r in view.model_rows(cat.models.values(), entry)}
    assert rows["alpha"]["state"] == "serving, unhealthy" and rows["alpha"]["revision"] == 3
    assert rows["gamma"]["state"] == "switching (starting)"
    assert rows["beta"]["state"] == "stopped" and rows["beta"]["layout"] == "TP=4"


def test_a_model_the_running_switch_replaces_is_shown_down_from_stopping_on() -> None:
    """The serving record moves at the end of a switch; the page says the displaced model is down before."""
    cat = make_catalog()
    entry = {
        "serving": {"model": "alpha", "revision": 1, "unit": "vllm-alpha.service", "healthy": False},
        "running": [{"model": "beta", "phase": "freeing"}],
    }
    rows = {r["model"]: r for r in view.model_rows(cat.models.values(), entry)}
    assert rows["alpha"]["state"] == "stopped (replaced by beta)"
    entry["running"] = [{"model": "gamma", "phase": "starting"}]  # GPUs 4-7: alpha keeps serving
    assert view.model_rows(cat.models.values(), entry)[0]["state"] == "serving, unhealthy"


def test_timeline_marks_the_current_phase_and_counts_its_seconds_to_now() -> None:
    """Ended phases keep their duration; the open one counts to now and is current."""
    running = {
        "id": 7,
        "model": "beta",
        "revision": 2,
        "op": "switch",
        "timings": [
            {"phase": "stopping", "entered_at": 10.0, "left_at": 12.5},
            {"phase": "freeing", "entered_at": 12.5, "left_at": None},
        ],
    }
    tl = view.timeline(running, [{"at": 11.0, "event": "stop", "fields": {"unit": "vllm-alpha.service"}}], now=20.0)
    assert [(p["phase"], p["seconds"], p["current"]) for p in tl["phases"]] == [
        ("stopping", 2.5, False),
        ("freeing", 7.5, True),
    ]
    assert tl["lines"][0]["text"] == "stop vllm-alpha.service"


def test_no_running_operation_is_an_idle_timeline() -> None:
    """Without a running operation the timeline is empty and inactive."""
    assert view.timeline(None, [], now=1.0) == {"active": False, "phases": [], "lines": []}


def test_downtime_sums_the_phases_from_stop_to_ready() -> None:
    """Staging and preflight are not downtime (the old model still serves); stop to checking is."""
    row = _row(
        1,
        "a",
        [
            ("preflight", 1.0),
            ("staging", 100.0),
            ("stopping", 2.0),
            ("freeing", 1.0),
            ("starting", 30.0),
            ("checking", 5.0),
            ("active", None),
        ],
    )
    assert view.downtime_s(row) == 38.0
    assert view.downtime_s(_row(2, "a", [("preflight", 1.0), ("aborted", None)])) is None


def test_a_switch_that_keeps_serving_has_no_downtime() -> None:
    """A handover or beside switch starts the target while the old model serves: its phases are no gap."""
    phases = [
        ("staging", 1.0),
        ("starting", 30.0),
        ("checking", 5.0),
        ("routing", 0.2),
        ("sleeping", 0.4),
        ("active", None),
    ]
    for mode in ("handover", "beside"):
        assert view.downtime_s({**_row(1, "a", phases), "plan": {"mode": mode, "reason": ""}}) == 0.0
    assert view.downtime_s({**_row(1, "a", phases), "plan": {"mode": "stop_start", "reason": ""}}) == 35.6


def test_downtime_series_is_oldest_first_with_one_series_per_model() -> None:
    """The chart's x axis runs forward in time; a model's series has gaps where another model deployed."""
    history = [
        _row(3, "b", [("stopping", 4.0)], at=300.0),
        _row(2, "a", [("preflight", 1.0)], at=200.0),
        _row(1, "a", [("stopping", 2.0)], at=100.0),
    ]
    assert view.downtime_series(history) == {
        "x": [100.0, 300.0],
        "series": [{"label": "a", "values": [2.0, None]}, {"label": "b", "values": [None, 4.0]}],
    }


def test_tune_series_puts_each_candidate_on_the_concurrency_axis() -> None:
    """A candidate that failed to load has no points and keeps its error; the winner is flagged."""
    report = {
        "concurrency": [1, 4],
        "candidates": [
            {"layout": "TP=4", "winner": True, "levels": {"1": {"tok_s": 50.0}, "4": {"tok_s": 180.0}}},
            {"layout": "TP=8", "winner": False, "error": "OOM", "levels": {}},
        ],
    }
    assert view.tune_series(report) == {
        "x": [1, 4],
        "series": [
            {"label": "TP=4", "winner": True, "error": None, "values": [50.0, 180.0]},
            {"label": "TP=8", "winner": False, "error": "OOM", "values": [None, None]},
        ],
    }


def test_dashboard_socket_defaults_to_the_state_dir() -> None:
    """Without `socket`, the dashboard serves <state_dir>/dashboard.sock."""
    cat = make_catalog(state_dir="/var/lib/orch/")
    assert view.socket_path(cat.dashboard, cat.state_dir) == "/var/lib/orch/dashboard.sock"


@pytest.mark.parametrize("bad", [{"socket": "relative/dash.sock"}, {"refresh_s": 0}, {"port": 8080}])
def test_bad_dashboard_settings_are_refused(bad: dict[str, object]) -> None:
    """A relative socket path, a refresh of 0 s or an unknown key (no TCP port exists) is refused."""
    with pytest.raises(ValidationError, match="dashboard"):
        make_catalog(dashboard=bad)


def test_bench_series_put_every_model_on_the_union_of_concurrencies() -> None:
    """Models benchmarked at different levels share one axis; a level a model lacks is a gap."""
    rows = view.bench_rows(
        [
            {
                "model": "a",
                "revision": 1,
                "layout": "TP=4",
                "bench": {"levels": [{"concurrency": 1, "output_tok_s": 10.0, "ttft_ms": {"p90": 5.0}}]},
            },
            {"model": "b", "revision": 2, "bench": {"levels": [{"concurrency": 4, "output_tok_s": 30.0}]}},
        ]
    )
    assert view.bench_series(rows, "tok_s") == {
        "x": [1, 4],
        "series": [
            {"label": "a TP=4", "winner": False, "values": [10.0, None]},
            {"label": "b", "winner": False, "values": [None, 30.0]},
        ],
    }
    assert view.bench_series(rows, "ttft_p90_ms")["series"][1]["values"] == [None, None]


def test_a_bad_dashboard_key_in_deploy_toml_names_the_file_key_and_value(tmp_path: Path) -> None:
    """deploy.toml's [dashboard] is checked at load: the error names the file, the key and the value (exit 2)."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text('[hosts.box]\naddress = "127.0.0.9"\ngpus = 8\n[dashboard]\nsocket = "run/d.sock"\n')
    with pytest.raises(ConfigError) as err:
        settings.load(cfg)
    assert err.value.exit_code == 2
    assert str(cfg) in str(err.value) and "dashboard.socket" in str(err.value) and "run/d.sock" in str(err.value)


def test_the_running_switchs_target_unit_owns_its_new_engines_pids() -> None:
    """Mid-switch the new engine is the running operation's target, not "not ours", though nothing serves it yet."""
    entry = {
        "serving": {"model": "alpha", "unit": "vllm-alpha.service"},
        "running": [{"id": 4, "model": "gamma", "phase": "starting"}],
    }
    units = view.unit_owners(entry, {"alpha": "vllm-alpha.service", "gamma": "vllm-gamma.service"})
    assert units == {"vllm-alpha.service": "alpha", "vllm-gamma.service": "gamma"}


def test_progress_lines_are_newest_first_without_repeats() -> None:
    """The box shows the top of the list: the newest line first, a repeated wait once (its latest report)."""
    events = [
        {"at": 1.0, "event": "stop", "fields": {"unit": "vllm-alpha.service"}},
        {"at": 2.0, "event": "stop", "fields": {"unit": "vllm-alpha.service"}},
        {
            "at": 3.0,
            "event": "waiting",
            "fields": {"unit": "vllm-beta.service", "last": "loading", "seconds": 5, "deadline": 600},
        },
        {
            "at": 8.0,
            "event": "waiting",
            "fields": {"unit": "vllm-beta.service", "last": "loading", "seconds": 10, "deadline": 600},
        },
    ]
    tl = view.timeline({"id": 1, "timings": []}, events, now=9.0)
    assert [ln["text"] for ln in tl["lines"]] == [
        "waiting for vllm-beta.service: loading (10 s of 600 s)",
        "stop vllm-alpha.service",
    ]


def test_a_warm_steps_progress_line_says_what_it_waits_for() -> None:
    """A warm step's event reads as the CLI words it (the reason a model stops), not as the bare event name."""
    line = view.progress_line("stopping", {"model": "alpha", "reason": "the host RAM budget holds no sleeper"})
    assert line == "alpha stops: the host RAM budget holds no sleeper"


def test_a_running_switchs_downtime_counts_its_current_phase_to_now() -> None:
    """The history row of the running switch counts the phase it is in (freeing for 10 s), not only those it left."""
    running = {
        "id": 7,
        "timings": [
            {"phase": "stopping", "entered_at": 10.0, "left_at": 10.4},
            {"phase": "freeing", "entered_at": 10.4, "left_at": None},
        ],
    }
    op = view.timeline(running, [], now=20.4)
    row = _row(7, "beta", [("stopping", 0.4), ("freeing", None)])
    assert view.history_rows([row], op)[0]["downtime_s"] == 10.4
    assert view.history_rows([row])[0]["downtime_s"] == 0.4  # without the operation: its record alone
