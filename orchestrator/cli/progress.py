"""Progress of a running operation: a line per event, with a live spinner on a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.status import Status

from orchestrator.core.progress_text import warm_line
from orchestrator.core.states import phase_label, text_of

T = TypeVar("T")


class ProgressPrinter:
    def __init__(self, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.status: Status | None = None

    def _line(self, text: str, style: str = "") -> None:
        if self.quiet:
            return
        stamp = f"{time.monotonic() - self.t0:7.1f}s"
        self.console.print(f"[dim]{stamp}[/] " + (f"[{style}]{text}[/]" if style else text))

    def _spin(self, text: str) -> None:
        if self.quiet or not self.console.is_terminal:
            return
        if self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None

    def __call__(self, event: str, fields: dict[str, Any]) -> None:
        if event == "phase":
            phase = text_of(str(fields.get("phase")))
            label = phase_label(
                str(fields.get("phase")),
                proxy=bool(fields.get("proxy", True)),
                handover=bool(fields.get("handover", False)),
                beside=bool(fields.get("beside", False)),
            )
            if label is None:
                return
            self._line(f"#{fields.get('revision', '?')} {fields.get('model', '')}: {label}", phase.style)
            self._spin(label)
        elif event == "waiting":
            text = (
                f"  waiting for {fields['unit']}: {fields.get('last')} "
                f"({fields['seconds']:.0f} s of {fields['deadline']:g} s)"
            )
            self._line(text, "dim")
        elif event == "stage_progress":
            done, total = int(fields.get("bytes", 0)), int(fields.get("total", 0) or 0)
            pct = f" {100 * done / total:.0f}%" if total else ""
            self._spin(f"staging {fields.get('file', '')}: {done / 2**20:.1f} MiB{pct}")
        elif event == "stop":
            self._line(f"  stopping {fields['unit']}")
        elif event == "reap":
            self._line(f"  {fields['unit']} left pids {fields['pids']}: sending {fields['signal']}", "yellow")
        elif event == "gpus_free":
            self._line(f"  GPUs {fields['gpus']} free after {fields['seconds']:.1f} s")
        elif event == "installed":
            what = "written, daemon-reload" if fields.get("changed") else "unchanged"
            self._line(f"  {fields['unit']} {what} (sha256 {fields['sha256']})")
        elif event == "ready":
            self._line(f"  {fields['unit']} ready after {fields['seconds']:.1f} s", "green")
        elif event == "rollback" and "to_set" in fields:  # with the proxy: the serving set as it was
            self._line(
                f"  rolling back to the serving set before: {', '.join(fields['to_set']) or 'nothing'}", "yellow"
            )
        elif event == "rollback":
            self._line(f"  rolling back to revision {fields['to_revision']} ({fields['model']})", "yellow")
        elif (warm := warm_line(event, fields)) is not None:
            self._line("  " + warm[0], warm[1])
        elif event == "stage_verified":
            self._line(f"  weights verified: {fields.get('checked', '')}")
        elif event == "staged":
            self._line(f"  weights staged: {fields.get('path', fields.get('model', ''))}")
        elif event.startswith("tune_"):
            self._tune(event, fields)
        elif event == "following":
            where = f", revision {fields['revision']} in phase {fields['phase']}" if fields.get("phase") else ""
            self._line(f"following {fields['op']} {fields.get('what') or ''} on {fields['host']}{where}", "bold")
        elif event == "parked":
            self._line(f"  parked in phase {fields['phase']}; `recover` or the agent's next start resumes it", "yellow")

    def _tune(self, event: str, f: dict[str, Any]) -> None:
        if event == "tune_candidate":
            self._line(f"tune {f['index']}/{f['of']}: {f['layout']} ({f['candidate']})", "bold")
        elif event == "tune_failed":
            self._line(f"  {f['candidate']} did not load ({f['outcome']}): {f['error']}", "red")
        elif event == "tune_bench":
            self._line(f"  benchmarking {f['candidate']}" + (f" ({f['repeat']}/{f['of']})" if f["of"] > 1 else ""))
            self._spin(f"benchmarking {f['candidate']}")
        elif event == "tune_skip":
            self._line(f"tune: {f['candidate']} already measured ({f['why']})", "dim")
        elif event == "tune_restore":
            self._line(f"tune: bringing back revision {f['to_revision']}", "yellow")
        elif event == "tune_winner":
            self._line(f"tune: winner {f['candidate']}: {f['action']}", "green")


def with_progress(quiet: bool, call: Callable[[ProgressPrinter], T]) -> T:
    """Run ``call`` with a progress printer, and stop its spinner however the call ends."""
    progress = ProgressPrinter(quiet=quiet)
    try:
        return call(progress)
    finally:
        progress.close()
