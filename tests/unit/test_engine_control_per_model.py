"""Engine control per model: HostPorts.engine_control_for asks the spec's engine, not the host."""

from __future__ import annotations

import pytest

from orchestrator.core.records import UnitSpec
from orchestrator.engines import ENGINES, VLLM, engine_named
from orchestrator.errors import UsageError
from orchestrator.testing import FakeEngineControl, FakeHost

SLEEPS = 'ExecStart=/opt/vllm/bin/vllm "serve" "--enable-sleep-mode"\n'
AWAKE_ONLY = 'ExecStart=/opt/vllm/bin/vllm "serve"\n'


def spec(unit_text: str, engine: str = VLLM.name) -> UnitSpec:
    return UnitSpec(
        model="m",
        unit_name="vllm-m.service",
        unit_text=unit_text,
        unit_sha="0",
        served_name="m",
        address="127.0.0.1",
        port=8000,
        gpus=(0,),
        load_deadline_s=60.0,
        model_dir="/m",
        engine=engine,
    )


def test_a_sleeping_unit_gets_its_engines_control() -> None:
    """A unit its engine runs with sleep mode gets that engine's control."""
    ports = FakeHost().ports()
    assert ports.engine_control_for(spec(SLEEPS)) is ports.engine_controls[VLLM.name]


def test_a_unit_without_sleep_mode_gets_no_control() -> None:
    """A unit its engine runs without sleep mode gets none: the model stops, never sleeps."""
    assert FakeHost().ports().engine_control_for(spec(AWAKE_ONLY)) is None


def test_a_host_without_the_engines_control_gets_none() -> None:
    """A host that wires no control for the spec's engine answers None, not another engine's."""
    ports = FakeHost().ports()
    ports.engine_controls = {"other": FakeEngineControl(FakeHost())}
    assert ports.engine_control_for(spec(SLEEPS)) is None


def test_an_unknown_engine_is_named() -> None:
    """A spec recorded on an engine this version does not know fails naming it and the known ones."""
    with pytest.raises(UsageError, match=r"engine 'sglang' is not known \(known: vllm\)"):
        FakeHost().ports().engine_control_for(spec(SLEEPS, engine="sglang"))


def test_a_record_without_an_engine_runs_on_vllm() -> None:
    """A spec recorded before the engine was kept (no `engine` key) reads back as the default engine's."""
    data = spec(SLEEPS).to_dict()
    del data["engine"]
    assert UnitSpec.from_dict(data).engine == VLLM.name


def test_every_engine_is_registered_under_its_own_name() -> None:
    """ENGINES maps each engine's name to it (what wiring builds one control for)."""
    assert all(engine_named(name).name == name for name in ENGINES)
