"""The dashboard's setting and the rows it shows, shaped from what the agent already answers.

Pure functions over the agent's own results (status, history, events, GPU snapshots, tune reports):
the dashboard keeps no state of its own, so the page and the CLI always agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import Field, field_validator

from orchestrator.core.catalog_rules import Strict, socket_file
from orchestrator.core.observed import GpuSnapshot
from orchestrator.core.progress_text import warm_line
from orchestrator.core.records import Mode
from orchestrator.core.states import DOWN, Phase, phase_label, text_of


class Dashboard(Strict):
    """``[dashboard]``: the read-only web page the agent serves on a Unix socket (no TCP port at all).

    The socket takes every local connection and answers 403 unless the peer (SO_PEERCRED) may use the
    agent's control socket; `orchestrator dashboard` forwards it to a local browser."""

    enabled: bool = True
    socket: str | None = None  # default <state_dir>/dashboard.sock
    refresh_s: float = Field(2.0, ge=0.2, le=60.0)  # how often a live page re-reads GPUs and models

    @field_validator("socket")
    @classmethod
    def _fits(cls, v: str | None) -> str | None:
        return None if v is None else socket_file(v, "socket")


def socket_path(settings: Dashboard, state_dir: str) -> str:
    return settings.socket or f"{state_dir.rstrip('/')}/dashboard.sock"


def unit_owners(entry: Mapping[str, Any], unit_of: Mapping[str, str]) -> dict[str, str]:
    """unit -> model for every engine of a host that may hold GPU memory: the serving ones, the sleepers
    (their residue) and the running operation's target, whose new engine loads before the serving record
    names it (``unit_of``: the catalog's model -> unit, for entries that name no unit)."""
    units = {str(m["unit"]): str(m["model"]) for m in entry.get("models") or []}
    if entry.get("serving"):
        units.setdefault(str(entry["serving"]["unit"]), str(entry["serving"]["model"]))
    for m in (entry.get("residency") or {}).get("models") or []:
        if m["state"] != "stopped" and m["model"] in unit_of:
            units.setdefault(unit_of[m["model"]], str(m["model"]))
    for r in entry.get("running") or []:
        unit = r.get("unit") or unit_of.get(r["model"])
        if unit:
            units.setdefault(str(unit), str(r["model"]))
    return units


def gpu_rows(
    snapshot: GpuSnapshot, owners: Mapping[int, str], states: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Each GPU with its memory and the processes on it, each named by the model whose unit holds its
    PID (``owners``: pid -> model), else "not ours"; with the model's residency (``states``: model ->
    serving/asleep), so a sleeper's residue reads as such."""
    rows = []
    states = states or {}
    for gpu in snapshot.gpus:
        procs: list[dict[str, Any]] = [
            {
                "pid": p.pid,
                "name": p.process_name,
                "mib": p.used_memory_mib,
                "model": owners.get(p.pid, "not ours"),
                "asleep": states.get(owners.get(p.pid, "")) == "asleep",
            }
            for p in snapshot.on({gpu.index})
        ]
        rows.append(
            {
                "index": gpu.index,
                "name": gpu.name,
                "used_mib": gpu.memory_used_mib,
                "total_mib": gpu.memory_total_mib,
                "used_pct": round(100 * gpu.memory_used_mib / gpu.memory_total_mib) if gpu.memory_total_mib else 0,
                "processes": procs,
                "models": sorted({str(p["model"]) for p in procs}),
            }
        )
    return rows


def layout(model: Any) -> str:
    parts = [f"TP={model.tensor_parallel}"]
    if model.pipeline_parallel > 1:
        parts.append(f"PP={model.pipeline_parallel}")
    if model.data_parallel > 1:
        parts.append(f"DP={model.data_parallel}")
    if model.expert_parallel:
        parts.append("EP")
    return " ".join(parts)


def model_rows(models: Iterable[Any], entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every catalog model of a host with its state: serving (and healthy or not), switching (the
    running operation targets it) or stopped; its layout, GPUs and port."""
    serving = {m["model"]: m for m in entry.get("models") or []}
    if entry.get("serving") and entry["serving"]["model"] not in serving:
        serving[entry["serving"]["model"]] = entry["serving"]
    running = {r["model"]: r for r in entry.get("running") or []}
    resident = {str(r["model"]): r for r in (entry.get("residency") or {}).get("models") or []}
    models = list(models)
    gpus = {m.name: set(m.gpus) for m in models}
    rows = []
    for m in models:
        live = serving.get(m.name)
        # The serving record moves at the end of a switch; from stopping on, the model whose GPUs the switch
        # takes is down already (the planner replaces what overlaps).
        taker = next(
            (
                r
                for r in running.values()
                if r["model"] != m.name and r["phase"] in DOWN and gpus[m.name] & gpus.get(r["model"], set())
            ),
            None,
        )
        if m.name in running:
            state = f"switching ({running[m.name]['phase']})"
        elif live is not None and taker is not None:
            verb = "stopping" if taker["phase"] == Phase.STOPPING else "stopped"
            state = f"{verb} (replaced by {taker['model']})"
        elif live is not None:
            state = "serving" if live.get("healthy", True) else "serving, unhealthy"
        elif m.name in resident and resident[m.name]["state"] == "asleep":
            state = "asleep"
        else:
            state = "stopped"
        res = resident.get(m.name)
        rows.append(
            {
                "model": m.name,
                "state": state,
                "revision": live.get("revision") if live else None,
                "layout": layout(m),
                "gpus": ",".join(str(g) for g in m.gpus),
                "port": m.port,
                "residency": residency_label(res) if res is not None else "",
                "ram_gib": float(res.get("ram_gib") or 0.0) if res is not None else None,
            }
        )
    return rows


def residency_label(rec: Mapping[str, Any]) -> str:
    """A model's residency as status reports it: serving (awake), asleep (its level), stopped."""
    if rec["state"] == "serving":
        return "awake"
    if rec["state"] == "asleep":
        level = rec.get("level")
        return f"asleep ({str(level).replace('level', 'level ')})" if level else "asleep"
    return "stopped"


def sleep_summary(residency: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The host RAM the sleepers hold against the budget (None: no model of the host sleeps)."""
    if not residency:
        return None
    held, budget = float(residency.get("sleep_ram_gib") or 0.0), float(residency.get("ram_budget_gib") or 0.0)
    return {
        "held_gib": held,
        "budget_gib": budget,
        "residue_gib": residency.get("residue_gib"),
        "pct": round(100 * held / budget) if budget else 0,
        "sleepers": [str(m["model"]) for m in residency.get("models") or [] if m["state"] == "asleep"],
        "gpus_error": residency.get("gpus_error"),
    }


def timeline(running: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]], now: float) -> dict[str, Any]:
    """The running operation as phases (from its stored record: entered, seconds, current) and the
    progress lines the CLI streams (``events``: {"at", "event", "fields"}), newest first: the box shows
    the top of the list, where what the switch waits for now must be."""
    if running is None:
        return {"active": False, "phases": [], "lines": []}
    phases = []
    for t in running.get("timings") or []:
        left = t.get("left_at")
        phases.append(
            {
                "phase": t["phase"],
                "label": text_of(t["phase"]).label,
                "seconds": round((left if left is not None else now) - t["entered_at"], 1),
                "current": left is None,
            }
        )
    return {
        "active": True,
        "id": running.get("id"),
        "model": running.get("model"),
        "revision": running.get("revision"),
        "trigger": running.get("trigger"),
        "op": running.get("op"),
        "phases": phases,
        "lines": progress_lines(events)[:LINES],
    }


LINES = 30  # the progress lines a running operation shows


def progress_lines(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Events as lines, newest first: a wait reported again (each few seconds) replaces its last report,
    and a line that repeats the one before it is shown once."""
    lines: list[dict[str, Any]] = []
    for e in events:
        fields = e.get("fields") or {}
        text = progress_line(str(e["event"]), fields)
        if not text:
            continue
        key = ("waiting", fields.get("unit")) if e["event"] == "waiting" else ("text", text)
        if lines and lines[-1]["key"] == key:
            lines[-1] = {"at": e["at"], "text": text, "key": key}
        else:
            lines.append({"at": e["at"], "text": text, "key": key})
    return [{"at": ln["at"], "text": ln["text"]} for ln in reversed(lines)]


def progress_line(event: str, f: Mapping[str, Any]) -> str:
    """One progress event as the CLI words it (cli/progress.py), shortened for a table cell."""
    if event == "phase":
        label = phase_label(
            str(f.get("phase")),
            proxy=bool(f.get("proxy", True)),
            handover=bool(f.get("handover", False)),
            beside=bool(f.get("beside", False)),
        )
        return "" if label is None else f"#{f.get('revision', '?')} {f.get('model', '')}: {label}"
    if event == "waiting":
        deadline = f" of {float(f['deadline']):g} s" if f.get("deadline") is not None else ""
        return f"waiting for {f.get('unit')}: {f.get('last')} ({float(f.get('seconds', 0)):.0f} s{deadline})"
    if event == "gpus_free":
        return f"GPUs {f.get('gpus')} free after {float(f.get('seconds', 0)):.1f} s"
    if event == "ready":
        return f"{f.get('unit')} ready after {float(f.get('seconds', 0)):.1f} s"
    if event in ("stop", "installed"):
        return f"{event} {f.get('unit')}"
    if event == "reap":
        return f"{f.get('unit')} left pids {f.get('pids')}: sending {f.get('signal')}"
    if event == "rollback" and "to_set" in f:
        return f"rolling back to the serving set before: {', '.join(f['to_set']) or 'nothing'}"
    if event == "rollback":
        return f"rolling back to revision {f.get('to_revision')} ({f.get('model')})"
    if event == "stage_progress":
        return ""  # many per second: the phase row says staging
    if (warm := warm_line(event, f)) is not None:
        return warm[0]
    return event + (f" {f.get('unit')}" if f.get("unit") else "")


def downtime_s(row: Mapping[str, Any]) -> float | None:
    """Seconds a deployment spent with nothing serving its GPUs (stop to ready), None if it never stopped
    anything. A handover or beside switch keeps the displaced engines serving until the route moves (a
    graceful reload): its phases run beside the serving model, so it counts 0."""
    mode = (row.get("plan") or {}).get("mode")
    if mode in set(Mode) and Mode(mode).keeps_serving:
        return 0.0
    spans = [p["seconds"] for p in row.get("phases") or [] if p["phase"] in DOWN and p["seconds"]]
    return round(sum(spans), 2) if spans else None


def history_rows(
    history: Sequence[Mapping[str, Any]], operation: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """History rows with each phase's duration and the downtime, newest first (as the agent answers).

    The running deployment's row takes its phases from ``operation`` (timeline's answer), whose current
    phase counts to now: its record has no duration for a phase it has not left yet."""
    return [_history_row(_live(h, operation)) for h in history]


def _live(row: Mapping[str, Any], operation: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if not operation or not operation.get("active") or operation.get("id") != row["id"]:
        return row
    return {**row, "phases": [{"phase": p["phase"], "seconds": p["seconds"]} for p in operation["phases"]]}


def _history_row(h: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": h["id"],
        "revision": h["revision"],
        "model": h["model"],
        "outcome": h["outcome"],
        "trigger": h.get("trigger"),
        "created_at": h["created_at"],
        "error": h.get("error"),
        "phases": [
            {"phase": p["phase"], "short": text_of(p["phase"]).short, "seconds": p["seconds"]}
            for p in h.get("phases") or []
        ],
        "downtime_s": downtime_s(h),
    }


def downtime_series(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Switch downtime per model over time, for a chart: x = start times (oldest first), one series per
    model with None where another model's deployment sits."""
    rows = [h for h in reversed(history) if downtime_s(h) is not None]
    models = sorted({h["model"] for h in rows})
    return {
        "x": [h["created_at"] for h in rows],
        "series": [{"label": m, "values": [downtime_s(h) if h["model"] == m else None for h in rows]} for m in models],
    }


def tune_series(report: Mapping[str, Any], key: str = "tok_s") -> dict[str, Any]:
    """A tune report as chart data: x = concurrency levels, ``key`` (tok/s, or TTFT p90 in ms with
    "ttft_p90_ms") per candidate, the winner flagged."""
    levels = [int(c) for c in report.get("concurrency") or []]
    series = []
    for row in report.get("candidates") or []:
        lv = {int(c): v for c, v in (row.get("levels") or {}).items()}
        series.append(
            {
                "label": row["layout"],
                "winner": bool(row.get("winner")),
                "error": row.get("error"),
                "values": [lv[c].get(key) if c in lv else None for c in levels],
            }
        )
    return {"x": levels, "series": series}


def bench_rows(benchmarks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The latest benchmark of each model (``compare``'s rows): tok/s and TTFT p90 per concurrency."""
    rows = []
    for b in benchmarks:
        levels = {
            int(lv["concurrency"]): {
                "tok_s": lv.get("output_tok_s"),
                "ttft_p90_ms": (lv.get("ttft_ms") or {}).get("p90"),
            }
            for lv in (b.get("bench") or {}).get("levels") or []
        }
        rows.append({"model": b["model"], "revision": b["revision"], "layout": b.get("layout") or "", "levels": levels})
    return rows


def bench_series(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """Bench rows as chart data: x = every concurrency measured, one series per model (and layout)."""
    levels = sorted({c for r in rows for c in r["levels"]})
    return {
        "x": levels,
        "series": [
            {
                "label": f"{r['model']} {r['layout']}".strip(),
                "winner": False,
                "values": [r["levels"][c][key] if c in r["levels"] else None for c in levels],
            }
            for r in rows
        ],
    }
