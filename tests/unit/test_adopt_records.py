"""adopt's revision over the records (deploy/adopt_record.py) with the fakes: what runs now is recorded (trigger
adopt), a switch replaces it and disables it, and rollback reinstalls the hand-written unit's own text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import adopt as a
from orchestrator.core import adopt_found as u
from orchestrator.deploy import adopt_record
from orchestrator.errors import AdoptError
from orchestrator.testing import FakeProxy

from .conftest import OpsWorld

UNIT = "vllm-hand.service"
HAND = """[Unit]
Description=written by hand

[Service]
User=root
Environment="CUDA_VISIBLE_DEVICES=0,1,2,3"
EnvironmentFile=-/etc/vllm/hand.env
ExecStart="/opt/vllm/bin/vllm" "serve" "/m/hand" "--served-model-name" "hand" "--port" "8005" \\
    "--tensor-parallel-size" "4" "--enforce-eager"

[Install]
WantedBy=multi-user.target
"""
MODELS = {
    "alpha": {"repo": "org/alpha", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8000},
    "beta": {"repo": "org/beta", "gpus": [0, 1, 2, 3], "tensor_parallel": 4, "port": 8001},
    # what `adopt --apply` pushed for the unit above
    "hand": {
        "repo": "local/hand",
        "source": "local:/m/hand",
        "served_name": "hand",
        "gpus": [0, 1, 2, 3],
        "tensor_parallel": 4,
        "port": 8005,
        "gpu_memory_utilization": 0.9,
        "args": ["--enforce-eager"],
    },
}


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OpsWorld:
    """A fake box running the hand-written unit, enabled; discovery answers it (the probes are
    test_adopt_discovery's)."""
    w = OpsWorld(tmp_path / "state", models=MODELS)
    sd = w.host.ports().systemd
    sd.install_unit(UNIT, HAND)
    sd.daemon_reload()
    sd.start(UNIT)
    sd.enable(UNIT)
    fields = u.parse_unit(HAND, UNIT)
    found = a.Found(
        argv=fields.argv,
        env=fields.env,
        user=fields.user,
        environment_files=fields.environment_files,
        unit=UNIT,
        unit_text=HAND,
    )

    def discover(ports: Any, units: Any, pids: Any, ours: Any) -> list[a.Found]:
        return [] if UNIT in ours else [found]

    monkeypatch.setattr(adopt_record, "discover", discover)
    return w


def test_adopted_unit_is_recorded_as_serving(box: OpsWorld) -> None:
    """One revision, trigger adopt, active and serving, its unit text the hand-written file's;
    a second run finds nothing."""
    recorded = box.ops.adopt_record(None, [UNIT])
    assert recorded == {"host": "box", "recorded": [{"model": "hand", "revision": 1, "unit": UNIT, "pid": None}]}
    serving = box.store.serving("box")
    assert serving is not None and serving.trigger == "adopt" and serving.spec.unit_text == HAND
    assert box.ops.adopt_record(None, [UNIT])["recorded"] == []
    [event] = box.events("adopted")
    assert (event["model"], event["revision"], event["unit"]) == ("hand", 1, UNIT)


def test_switch_away_disables_it_and_rollback_brings_it_back_exactly(box: OpsWorld) -> None:
    """The first switch stops and disables the hand-written unit; rollback reinstalls its text, enabled and serving."""
    box.ops.adopt_record(None, [UNIT])
    assert box.ops.switch("beta")["outcome"] == "active"
    unit = box.host.units[UNIT]
    assert (unit.active, unit.enabled) == ("inactive", False)
    back = box.ops.rollback()
    assert (back["outcome"], back["model"], back["unit"], back["restores"]) == ("active", "hand", UNIT, 1)
    unit = box.host.units[UNIT]
    assert (unit.text, unit.active, unit.enabled) == (HAND, "active", True)


def test_front_proxy_routes_the_adopted_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[proxy] on: the adopted engine joins the serving set and the proxy's config routes its served name."""
    w = OpsWorld(tmp_path / "state", models=MODELS, proxy={"enabled": True, "port": 9000})
    proxy = FakeProxy()
    ports = w.ops.ports_for("box")
    ports.proxy = proxy
    fields = u.parse_unit(HAND, UNIT)
    found = a.Found(argv=fields.argv, env=fields.env, unit=UNIT, unit_text=HAND)
    monkeypatch.setattr(adopt_record, "discover", lambda ports, units, pids, ours: [found])
    result = w.ops.adopt_record(None, [UNIT])
    assert result["proxy"] == "routed" and [d.model for d in w.store.serving_set("box")] == ["hand"]
    assert proxy.config is not None and "hand" in proxy.config and ":8005" in proxy.config


def test_entry_written_by_hand_before_is_adopted_under_its_name(box: OpsWorld) -> None:
    """deploy.toml already has model hand for the unit (the seeds' kimi-k25-int4): nothing to add, no blocker;
    a field it says otherwise is named; a port it says otherwise blocks."""
    found = box.ops.adopt(None, [UNIT])
    [x] = found["adopted"]
    assert (x["in_config"], x["blockers"], found["toml"]) == (True, [], "")
    assert x["differences"] == []
    moved = OpsWorld(
        Path(box.catalog.state_dir).parent / "moved", models={**MODELS, "hand": {**MODELS["hand"], "port": 8009}}
    )
    [y] = adopt_record.find(moved.catalog, moved.store, box.ops.ports_for("box"), [UNIT], [])["adopted"]
    assert y["in_config"] is False and any("has port 8009 but it runs with port 8005" in b for b in y["blockers"])


def test_record_needs_the_entry_in_deploy_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording before the entry was pushed: exit 2 naming the unit and the missing model."""
    w = OpsWorld(tmp_path / "state", models={k: v for k, v in MODELS.items() if k != "hand"})
    fields = u.parse_unit(HAND, UNIT)
    found = a.Found(argv=fields.argv, env=fields.env, unit=UNIT, unit_text=HAND)
    monkeypatch.setattr(adopt_record, "discover", lambda ports, units, pids, ours: [found])
    with pytest.raises(AdoptError) as exc:
        w.ops.adopt_record(None, [UNIT])
    assert exc.value.exit_code == 2 and f"unit {UNIT}: deploy.toml has no model 'hand'" in str(exc.value)
