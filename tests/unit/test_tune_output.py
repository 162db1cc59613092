"""The tune report's charts (terminal and SVG) and the tune store's records, with no host."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from orchestrator.adapters.tune_store import TuneStore, read_feedback
from orchestrator.core.tune_chart import svg_chart, text_chart
from orchestrator.core.tune_records import TuneResult

REPORT: dict[str, Any] = {
    "run": 3,
    "host": "h1",
    "model": "m",
    "concurrency": [1, 64],
    "candidates": [
        {"layout": "tp4", "winner": False, "error": None, "levels": {"1": {"tok_s": 60.0}, "64": {"tok_s": 2000.0}}},
        {"layout": "tp8+ep", "winner": True, "error": None, "levels": {"1": {"tok_s": 55.0}, "64": {"tok_s": 4000.0}}},
        {"layout": "tp8", "winner": False, "error": "ValueError: x", "levels": {}},
    ],
}


def test_text_chart_marks_the_winner_and_the_failure() -> None:
    """Bars scale to the peak; the winner has a star; a failed layout says so at every level."""
    text = text_chart(REPORT, width=20)
    assert "  *tp8+ep  " + "#" * 20 + " 4,000" in text
    assert "   tp4     " + "#" * 10 + " " * 10 + " 2,000" in text
    assert text.count("tp8     failed to load") == 2


def test_svg_chart_is_valid_xml_with_every_layout() -> None:
    """The SVG parses and its legend names each layout, the winner and the failure."""
    root = ElementTree.fromstring(svg_chart(REPORT))
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {"tp4", "tp8+ep (winner)", "tp8 (failed to load)"} <= set(texts)
    assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) == 2


def test_store_keeps_results_and_feedback_reads_them(tmp_path: Path) -> None:
    """A recorded failure and a finished run are read back by plan's read-only feedback."""
    store = TuneStore(tmp_path / "state.db", group=None)
    run = store.create("h1", "m", {"candidates": []}, 1, 10.0)
    store.record(TuneResult(run.id, "m.tp8", "tp8", "failed", 2, 2, "ValueError: x", "full", [], 11.0))
    assert store.unfinished("h1") == run
    store.finish(run.id, "done", 12.0, {"decision": {}})
    failed, latest = read_feedback(tmp_path / "state.db", "h1", "m")
    assert [(f.layout, f.error) for f in failed] == [("tp8", "ValueError: x")]
    assert latest is not None and latest.state == "done" and store.unfinished("h1") is None


def test_feedback_from_a_missing_store_is_empty(tmp_path: Path) -> None:
    """plan on a fresh box reads nothing and creates no state file."""
    assert read_feedback(tmp_path / "state.db", "h1", "m") == ([], None)
    assert not (tmp_path / "state.db").exists()
