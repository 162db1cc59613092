"""The weight store of one host: runs ``python -m orchestrator.worker.stage`` there through a Shell.

The worker does the I/O on the host that needs the weights (hub download with huggingface_hub,
local copy, or rsync from a peer) and streams JSON lines; this adapter turns them into progress
callbacks and ``Manifest`` values, and maps failures to ``WeightsError`` naming the host.
"""

from __future__ import annotations

import json
from collections.abc import Collection

from orchestrator.core.observed import CommandResult
from orchestrator.core.weights import Manifest, StagedRevision, StageRequest
from orchestrator.errors import WeightsError
from orchestrator.ports import ProgressCallback, Shell
from orchestrator.secrets import redact

# Worker event -> the ProgressCallback event the CLI knows (cli/progress.py renders stage_progress
# and staged; the others are there for logs).
EVENTS = {
    "progress": "stage_progress",
    "plan": "stage_plan",
    "file_done": "stage_file",
    "resume": "stage_resume",
    "restage": "stage_restage",
    "already_staged": "staged",
    "sha256_mismatch": "stage_sha256_mismatch",
    "cleanup": "stage_cleanup",
    "verified": "stage_verified",
}


class HfWeightStore:
    """WeightStore over any Shell; the worker's progress lines stream back while it downloads."""

    def __init__(self, shell: Shell, *, python: str = "python3", timeout: float | None = None) -> None:
        self.shell = shell
        self.python = python
        self.timeout = timeout

    @property
    def host(self) -> str:
        return self.shell.host

    def _argv(self, *args: str) -> list[str]:
        return [self.python, "-m", "orchestrator.worker.stage", *args]

    def stage(self, request: StageRequest, progress: ProgressCallback) -> Manifest:
        final: dict[str, object] = {}

        def on_line(line: str) -> None:
            event = _parse(line)
            if event is None:
                return
            kind = str(event.pop("event", ""))
            if kind in ("done", "error"):
                final.update(event, event=kind)
            elif kind in EVENTS:
                progress(EVENTS[kind], {"host": self.host, "model": request.name, **event})

        argv = self._argv("stage", json.dumps(request.to_dict()))
        result = self.shell.run_streaming(argv, on_line, timeout=self.timeout)
        manifest = final.get("manifest")
        if final.get("event") == "done" and isinstance(manifest, dict):
            return Manifest.from_dict(manifest)
        raise self._failure(result, final, f"staging model {request.name}")

    def verify(self, root: str, name: str, revision: str) -> Manifest | None:
        done = self._call(f"verifying model {name}", "verify", root, name, revision)
        manifest = done.get("manifest")
        return Manifest.from_dict(manifest) if isinstance(manifest, dict) else None

    def check(self, path: str) -> dict[str, object]:
        """Verify a model directory used in place (index, sizes, headers, known sha256s): what was checked."""
        return self._call(f"verifying weights in {path}", "check", path)

    def free_bytes(self, path: str) -> int:
        done = self._call(f"free space under {path}", "free", path)
        return int(str(done["free_bytes"]))

    def list_staged(self, root: str) -> list[StagedRevision]:
        done = self._call(f"listing models under {root}", "list", root)
        entries = done.get("staged")
        return [
            _revision(e)
            for e in (entries if isinstance(entries, list) else [])
            if isinstance(e, dict) and not e.get("partial")
        ]

    def remove(self, root: str, name: str, revision: str, *, protected: Collection[tuple[str, str]] = ()) -> bool:
        if (name, revision) in set(protected):
            raise WeightsError(
                f"model {name} revision {revision} is protected (active or rollback) and was not removed",
                host=self.host,
            )
        return bool(self._call(f"removing model {name}", "remove", root, name, revision)["removed"])

    def cleanup(
        self, root: str, *, keep: int, protected: Collection[tuple[str, str]], unit_dir: str | None = None
    ) -> list[StagedRevision]:
        # The worker finds nothing to remove without the directory either; this test costs a few ms
        # where a worker's start costs a Python with the project's imports, after every switch.
        if not self.shell.run(["test", "-d", root], check=False, idempotent=True).ok:
            return []
        pairs = json.dumps(sorted([n, r] for n, r in set(protected)))
        extra = ["--unit-dir", unit_dir] if unit_dir else []
        done = self._call(f"removing old revisions under {root}", "cleanup", root, str(keep), pairs, *extra)
        removed = done.get("removed")
        return [_revision(e) for e in (removed if isinstance(removed, list) else []) if isinstance(e, dict)]

    def _call(self, what: str, *args: str) -> dict[str, object]:
        result = self.shell.run(self._argv(*args), timeout=self.timeout, check=False)
        final: dict[str, object] = {}
        for line in result.stdout.splitlines():
            event = _parse(line)
            if event is not None and event.get("event") in ("done", "error"):
                final = event
        if final.get("event") == "done":
            return final
        raise self._failure(result, final, what)

    def _failure(self, result: CommandResult, final: dict[str, object], what: str) -> WeightsError:
        if final.get("event") == "error":
            return WeightsError(redact(str(final.get("message"))), host=self.host)
        tail = "\n".join(redact(result.stderr or result.stdout).strip().splitlines()[-5:])
        return WeightsError(
            f"{what}: the stage worker exited {result.exit_code} without a result" + (f":\n{tail}" if tail else ""),
            host=self.host,
        )


def _revision(entry: dict[str, object]) -> StagedRevision:
    return StagedRevision(
        str(entry["name"]), str(entry["revision"]), float(str(entry["staged_at"])), int(str(entry.get("bytes", 0)))
    )


def _parse(line: str) -> dict[str, object] | None:
    """A worker event, or None for a line that is not one (e.g. a warning a library printed)."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None
