"""The dashboard's pages, rendered on the server from jinja2 templates in the package.

The tables are plain HTML (they work with JavaScript off); a page's script only swaps in the sections
the SSE stream sends (rendered by the same templates) and draws charts from JSON embedded in the page.
"""

from __future__ import annotations

import datetime
import json
import threading
from typing import Any

import jinja2

from orchestrator.core import dashboard as view
from orchestrator.core.tune_chart import svg_chart
from orchestrator.dashboard.live import Live

SECTIONS = ("gpus", "models", "operation", "history", "events", "bench")


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("orchestrator.dashboard", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters["when"] = _when
    env.filters["secs"] = lambda s: "" if s is None else f"{s:.1f} s"
    env.filters["gib"] = lambda mib: f"{mib / 1024:.1f}"
    return env


def _charts(host: dict[str, Any]) -> dict[str, Any]:
    return {"downtime": host["downtime"], "bench_tok_s": view.bench_series(host["bench"], "tok_s"),
            "bench_ttft": view.bench_series(host["bench"], "ttft_p90_ms")}


class Pages:
    def __init__(self, live: Live) -> None:
        self.live = live
        self.env = _env()
        self._lock = threading.Lock()
        self._cached: tuple[int, dict[str, Any]] | None = None  # (version, sections): one read per change


    def route(self, path: str) -> tuple[str, bytes] | None:
        html = "text/html; charset=utf-8"
        if path == "/":
            return html, self.box_page().encode()
        if path == "/api/box":
            return "application/json", json.dumps(self.live.box()).encode()
        if path == "/tune":
            return html, str(self.tune_page(None)).encode()
        if path.startswith("/tune/") and path.removeprefix("/tune/").isdigit():
            page = self.tune_page(int(path.removeprefix("/tune/")))
            return None if page is None else (html, page.encode())
        return None

    def box_page(self) -> str:
        box = self.live.box()
        return self.env.get_template("box.html.j2").render(
            box=box, sections={h["name"]: self._sections(h) for h in box["hosts"]},
            charts=json.dumps({h["name"]: _charts(h) for h in box["hosts"]}))

    def sections(self) -> dict[str, Any]:
        """The live parts of the box page: element id -> HTML, and the chart data; every open page
        of one version gets the same answer, read once (GPUs and health probes are not free)."""
        with self._lock:
            version = self.live.version
            if self._cached is None or self._cached[0] != version:
                self._cached = (version, self._read_sections())
            return self._cached[1]

    def _read_sections(self) -> dict[str, Any]:
        box = self.live.box()
        out: dict[str, Any] = {"html": {}, "charts": {}, "at": _when(box["at"])}
        for i, host in enumerate(box["hosts"]):
            for name, html in self._sections(host).items():
                out["html"][f"h{i}-{name}"] = html
            out["charts"][host["name"]] = _charts(host)
        return out

    def _sections(self, host: dict[str, Any]) -> dict[str, str]:
        return {name: self.env.get_template(f"{name}.html.j2").render(host=host) for name in SECTIONS}

    def tune_page(self, run_id: int | None) -> str | None:
        box = self.live.box()
        runs = [{**r, "host": h["name"]} for h in box["hosts"] for r in self.live.tune_runs(h["name"])]
        chosen = runs[0] if run_id is None and runs else next((r for r in runs if r["id"] == run_id), None)
        if run_id is not None and chosen is None:
            return None
        report = chosen["report"] if chosen else None
        return self.env.get_template("tune.html.j2").render(
            runs=runs, chosen=chosen, report=report,
            svg=svg_chart(report) if report else "",
            chart=json.dumps(view.tune_series(report) if report else None),
            ttft=json.dumps(view.tune_series(report, "ttft_p90_ms") if report else None))
