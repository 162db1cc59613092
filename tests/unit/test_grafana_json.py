"""The Grafana dashboard JSON: importable (the schema's basics), every panel queries the agent's metrics.
That each queried metric exists in a real agent's /metrics is checked in tests/test_dashboard_hosts.py."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest

DASH: dict[str, Any] = json.loads(resources.files("orchestrator.dashboard").joinpath("grafana.json").read_text())
DS = "${DS_PROMETHEUS}"


def test_it_is_an_importable_dashboard_with_a_datasource_input() -> None:
    """Top-level keys Grafana needs, and the Prometheus data source asked for at import (not hard-coded)."""
    assert {"title", "uid", "schemaVersion", "panels", "templating", "time"} <= set(DASH)
    assert isinstance(DASH["schemaVersion"], int) and DASH["schemaVersion"] >= 30
    assert DASH["__inputs"] == [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    assert "id" not in DASH or DASH["id"] is None  # an id would clash with the importing instance's


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    """Each panel has its own id, a type, a title and a place on the 24-column grid that no other panel takes."""
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for p in DASH["panels"]:
        assert p["type"] and p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells


@pytest.mark.parametrize("panel", DASH["panels"], ids=lambda p: str(p["title"]))
def test_every_target_queries_an_orchestrator_metric_from_the_input_datasource(panel: dict[str, Any]) -> None:
    """Targets have refIds, use the imported data source and query at least one orchestrator_* metric."""
    assert panel["datasource"]["uid"] == DS
    refs = [t["refId"] for t in panel["targets"]]
    assert refs and len(refs) == len(set(refs))
    for t in panel["targets"]:
        assert t["datasource"]["uid"] == DS
        assert re.search(r"\borchestrator_[a-z0-9_]+", t["expr"]), t["expr"]
        assert t["expr"].count("(") == t["expr"].count(")")


def test_the_host_variable_reads_the_hosts_from_the_agents_metric() -> None:
    """$host lists the hosts the agents report, all selected by default."""
    (var,) = DASH["templating"]["list"]
    assert var["name"] == "host" and var["includeAll"] and var["datasource"]["uid"] == DS
    assert var["query"]["query"] == "label_values(orchestrator_active_model_info, host)"


def test_the_warm_panels_show_each_models_residency_from_the_gauge() -> None:
    """A warm-switch panel reads orchestrator_model_residency (awake / asleep / stopped per model), and
    its value mappings name each state the query yields (2, 1, 0)."""
    warm = [
        p
        for p in DASH["panels"]
        if p["title"].startswith("Warm switches")
        and any("orchestrator_model_residency" in t["expr"] for t in p["targets"])
    ]
    assert {p["type"] for p in warm} >= {"state-timeline", "table"}
    timeline = next(p for p in warm if p["type"] == "state-timeline")
    (mapping,) = timeline["fieldConfig"]["defaults"]["mappings"]
    assert {k: v["text"] for k, v in mapping["options"].items()} == {"2": "awake", "1": "asleep", "0": "stopped"}
