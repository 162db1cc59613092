"""The dashboard's pages, rendered on the server from jinja2 templates in the package.

The tables are plain HTML (they work with JavaScript off); a page's script only swaps in the sections
the SSE stream sends (rendered by the same templates) and draws charts from JSON embedded in the page.
"""

from __future__ import annotations

import datetime
import json
import re
import threading
from typing import Any

import jinja2

from orchestrator.core import dashboard as view
from orchestrator.core.dashboard_fleet import own_hosts
from orchestrator.core.tune_chart import svg_chart
from orchestrator.dashboard.live import Live

SECTIONS = ("gpus", "models", "operation", "history", "events", "bench")
FLEET_SECTIONS = ("rollout", "boxes")


class Redirect(str):
    """A route's answer that sends the browser elsewhere (303), e.g. a pure controller's / to /fleet."""


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.datetime.fromtimestamp(at, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("orchestrator.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["secs"] = lambda s: "" if s is None else f"{s:.1f} s"
    env.filters["gib"] = lambda mib: f"{mib / 1024:.1f}"
    return env


def _charts(host: dict[str, Any]) -> dict[str, Any]:
    return {
        "downtime": host["downtime"],
        "bench_tok_s": view.bench_series(host["bench"], "tok_s"),
        "bench_ttft": view.bench_series(host["bench"], "ttft_p90_ms"),
    }


class Pages:
    def __init__(self, live: Live) -> None:
        self.live = live
        self.env = _env()
        self._lock = threading.Lock()
        self._cached: tuple[int, dict[str, Any]] | None = None  # (version, sections): one read per change
        self._fleet_cached: tuple[int, dict[str, Any]] | None = None
        self._fleet_lock = threading.Lock()  # its own: a fan-out to the boxes must not hold the box page

    def route(self, path: str) -> tuple[str, bytes] | Redirect | None:
        html = "text/html; charset=utf-8"
        controller = self.live.fleet.is_controller()
        if path == "/":
            if controller and not own_hosts(self.live.agent.catalog):
                return Redirect("/fleet")  # nothing of its own to show: the controller's page is the fleet's
            return html, self.box_page().encode()
        if path == "/fleet" and controller:
            return html, self.fleet_page().encode()
        if path.startswith("/fleet/box/") and controller:
            box = self.live.fleet.box(path.removeprefix("/fleet/box/"))
            return (
                None
                if box is None
                else (
                    html,
                    self.env.get_template("fleet_box.html.j2").render(box=box, host=box, controller=True).encode(),
                )
            )
        if path == "/api/fleet" and controller:
            return "application/json", json.dumps(self.live.fleet_view()).encode()
        if path == "/api/box":
            return "application/json", json.dumps(self.live.box()).encode()
        if path == "/tune":
            return html, str(self.tune_page(None)).encode()
        if re.fullmatch(r"/tune/[0-9]{1,18}", path):  # ASCII digits of a SQLite integer ('²' is a digit too)
            page = self.tune_page(int(path.removeprefix("/tune/")))
            return None if page is None else (html, page.encode())
        return None

    def box_page(self) -> str:
        box = self.live.box()
        return self.env.get_template("box.html.j2").render(
            box=box,
            controller=bool(box["groups"]),
            sections={h["name"]: self._sections(h) for h in box["hosts"]},
            charts=json.dumps({h["name"]: _charts(h) for h in box["hosts"]}),
        )

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

    # -- the fleet page (a controller's) ----------------------------------------------------------------
    def fleet_page(self) -> str:
        fleet = self.live.fleet_view()
        return self.env.get_template("fleet.html.j2").render(
            fleet=fleet, controller=True, sections={g["name"]: self._fleet_sections(g) for g in fleet["groups"]}
        )

    def fleet_sections(self) -> dict[str, Any]:
        """The live parts of the fleet page, read once per version for every open page (the boxes are
        asked over SSH: not once per page)."""
        with self._fleet_lock:
            version = self.live.version
            if self._fleet_cached is None or self._fleet_cached[0] != version:
                fleet = self.live.fleet_view()
                out: dict[str, Any] = {"html": {}, "charts": {}, "at": _when(fleet["at"])}
                for i, group in enumerate(fleet["groups"]):
                    for name, html in self._fleet_sections(group).items():
                        out["html"][f"g{i}-{name}"] = html
                self._fleet_cached = (version, out)
            return self._fleet_cached[1]

    def _fleet_sections(self, group: dict[str, Any]) -> dict[str, str]:
        return {name: self.env.get_template(f"fleet_{name}.html.j2").render(group=group) for name in FLEET_SECTIONS}

    def tune_page(self, run_id: int | None) -> str | None:
        box = self.live.box()
        runs = [{**r, "host": h["name"]} for h in box["hosts"] for r in self.live.tune_runs(h["name"])]
        chosen = runs[0] if run_id is None and runs else next((r for r in runs if r["id"] == run_id), None)
        if run_id is not None and chosen is None:
            return None
        report = chosen["report"] if chosen else None
        return self.env.get_template("tune.html.j2").render(
            controller=self.live.fleet.is_controller(),
            runs=runs,
            chosen=chosen,
            report=report,
            svg=svg_chart(report) if report else "",
            chart=json.dumps(view.tune_series(report) if report else None),
            ttft=json.dumps(view.tune_series(report, "ttft_p90_ms") if report else None),
        )
