"""Property tests: no config, however broken, makes the planner raise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.planner import (
    Hardware,
    Layout,
    Verdict,
    Workload,
    check,
    estimate_weight_bytes_from_config,
    layouts,
    plan,
    weight_bytes_from_index,
)

CONFIGS = Path(__file__).parents[1] / "fixtures" / "configs"
REAL = {p.stem: json.loads(p.read_text()) for p in sorted(CONFIGS.glob("*.json"))}
KEYS = sorted({k for cfg in REAL.values() for k in cfg} | {k for k in REAL["moonshotai__Kimi-K2.5"]["text_config"]})

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.integers(10**300, 10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=6)
    ),
    max_leaves=20,
)
configs = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=25)
small_layouts = st.builds(Layout, st.integers(1, 9), st.integers(1, 3), st.integers(1, 3), st.booleans())
hosts = st.builds(Hardware, st.integers(1, 9), st.floats(1, 200), st.none(), st.none())
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_clean(v: Verdict) -> None:
    assert v.valid == (not v.reasons)
    assert all(isinstance(r, str) and r for r in v.reasons)
    json.dumps(v.to_dict())


@FAST
@given(configs, small_layouts, hosts)
def test_arbitrary_configs_give_a_clean_verdict(config: dict[str, Any], layout: Layout, hw: Hardware) -> None:
    """Any JSON-like config with real key names but junk values yields a verdict, never an exception."""
    assert_clean(check(config, layout, hw))


@FAST
@given(json_values, small_layouts)
def test_non_mapping_json_gives_a_clean_verdict(config: Any, layout: Layout) -> None:
    """Even a top-level list or number is answered with an invalid verdict."""
    v = check(config, layout, Hardware(8, 96.0))
    assert_clean(v)
    if not isinstance(config, dict):
        assert not v.valid


@FAST
@given(st.sampled_from(sorted(REAL)), st.data(), small_layouts)
def test_truncated_real_configs_give_a_clean_verdict(name: str, data: st.DataObject, layout: Layout) -> None:
    """Dropping any subset of a real config's keys (top level and nested) still yields a verdict."""
    cfg = dict(REAL[name])
    keep = data.draw(st.sets(st.sampled_from(sorted(cfg))))
    cut = {k: v for k, v in cfg.items() if k in keep}
    if isinstance(cut.get("text_config"), dict):
        inner = cut["text_config"]
        inner_keep = data.draw(st.sets(st.sampled_from(sorted(inner))))
        cut["text_config"] = {k: v for k, v in inner.items() if k in inner_keep}
    assert_clean(check(cut, layout, Hardware(8, 96.0), weight_bytes=None))


@FAST
@given(st.sampled_from(sorted(REAL)), st.sampled_from(sorted({k for c in REAL.values() for k in c})), json_values)
def test_real_configs_with_one_corrupted_key(name: str, key: str, value: Any) -> None:
    """Replacing one key of a real config with junk yields a verdict and a plan."""
    cfg = dict(REAL[name])
    cfg[key] = value
    assert_clean(check(cfg, Layout(4), Hardware(8, 96.0)))
    p = plan(cfg, Layout(8), Hardware(8, 96.0), Workload(max_model_len=8192))
    json.dumps(p.to_dict())


@settings(max_examples=40, deadline=None)
@given(configs, st.integers(1, 8))
def test_layouts_are_all_valid(config: dict[str, Any], gpus: int) -> None:
    """layouts() returns only valid verdicts, each with a why, for any config."""
    for v in layouts(config, Hardware(gpus, 80.0)):
        assert v.valid and v.why


@FAST
@given(json_values)
def test_index_and_estimate_never_raise(value: Any) -> None:
    """Junk indexes and configs give None or a positive size."""
    size = weight_bytes_from_index(value if isinstance(value, dict) else {"metadata": value})
    assert size is None or size > 0
    est = estimate_weight_bytes_from_config(value if isinstance(value, dict) else {})
    assert est is None or est > 0


workloads = st.builds(
    Workload,
    st.none() | st.integers(-10, 2**22),
    st.integers(0, 1024),
    st.integers(-1, 64),
    st.floats(-1, 2),
    st.sampled_from(["auto", "fp8", "fp8_e5m2", "bogus"]),
    st.floats(0, 50),
)
probed_hosts = st.builds(
    Hardware,
    st.integers(-1, 9),
    st.floats(0, 200),
    st.none() | st.lists(st.floats(0, 200), max_size=10).map(tuple),
    st.sampled_from([None, "nvlink", "pcie"]),
)


@FAST
@given(
    st.sampled_from(sorted(REAL)),
    st.none() | small_layouts,
    probed_hosts,
    workloads,
    st.none() | st.integers(1, 10**13),
    st.none() | st.lists(st.integers(-2, 10), max_size=9),
)
def test_plans_for_odd_hosts_and_workloads(
    name: str, layout: Layout | None, hw: Hardware, wl: Workload, weight_bytes: int | None, devices: list[int] | None
) -> None:
    """Odd hosts (no GPUs, partial free-memory probes), workloads and GPU indices still give a plan."""
    p = plan(REAL[name], layout, hw, wl, weight_bytes, devices)
    assert_clean(p.requested)
    assert p.valid or p.fix
    json.dumps(p.to_dict())
