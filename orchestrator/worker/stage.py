"""Stage model weights on the host that needs them: ``python -m orchestrator.worker.stage CMD ...``.

Runs locally or over SSH; prints one JSON object per line on stdout (``progress``, ``file_done``,
``done`` with the manifest, or ``error``) so the controller can stream byte progress. Files go to
``<root>/<name>/.staging-<sha>/`` and the directory is renamed to ``<root>/<name>/<sha>/`` only after
verification and an atomic manifest write, so a partial model is never taken as staged.

The hub token comes from HF_TOKEN or a root-only file; it is never printed (every line is scrubbed).
Sources (hub, local, peer) live in ``orchestrator.worker.sources``, file helpers in
``orchestrator.worker.files``.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from orchestrator.core.weights import (
    CONFIG_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    PART_SUFFIX,
    PROTECT_NAME,
    STAGING_PREFIX,
    Manifest,
    StagedRevision,
    StageRequest,
    check_space,
    fmt_bytes,
    is_commit_sha,
    plan_cleanup,
    reclaim_for,
    revisions_named_in,
    space_needed,
)
from orchestrator.engines import ENGINES
from orchestrator.errors import WeightsError
from orchestrator.worker.files import (
    current_file,
    dir_sizes,
    emit,
    free_bytes,
    fsync_dir,
    load_token,
    read_index,
    read_manifest,
    sha256_file,
    tree_bytes,
    write_atomic,
)
from orchestrator.worker.sources import SourcePlan, fetch_source, plan_source
from orchestrator.worker.verify import verify_in_place, verify_model

EXIT_WEIGHTS = 3


def verify_staged(root: str, name: str, revision: str) -> Manifest | None:
    """The manifest of a staged model whose files still match it; None when it is not staged."""
    final = Path(root) / name / revision
    manifest = read_manifest(final)
    if manifest is None:
        return None
    index = read_index(final, manifest.files)
    if index is not None and manifest.index_sha256 != sha256_file(final / INDEX_NAME):
        raise WeightsError(f"{final}: {INDEX_NAME} changed since it was staged")
    # Index, sizes and headers again (cheap); the sha256 of each file was checked when it was staged.
    verify_model(final, where=str(final), expected=manifest.files)
    return manifest


@contextmanager
def _root_lock(root: Path) -> Iterator[None]:
    """One stage per weight root at a time (flock on the directory itself: no lock file left)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise WeightsError(f"{root}: another stage is running under this weight root") from exc
        yield
    finally:
        os.close(fd)


class _Poller:
    """Reports bytes under the staging dir while a source writes there (hub, copy or rsync)."""

    def __init__(self, staging: Path, total: int) -> None:
        self.staging, self.total, self._stop = staging, total, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._last = -1

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.report()

    def report(self) -> None:
        try:
            done = tree_bytes(self.staging)
        except FileNotFoundError:  # a file renamed between listing and stat
            return
        if done != self._last:
            self._last = done
            emit("progress", bytes=done, total=self.total, file=current_file())

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.report()


def stage(req: StageRequest) -> Manifest:
    root = Path(req.root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WeightsError(f"weight root {root} cannot be created: {exc.strerror}") from exc
    with _root_lock(root):
        # A pinned, intact model needs no source at all (the hub may be unreachable on switch day).
        if is_commit_sha(req.revision) and (done := _already_staged(req, req.revision)) is not None:
            emit("already_staged", path=done.path)
            return done
        token = load_token(req.token_file) if req.source_kind == "hub" else None
        plan = plan_source(req, token)
        final = root / req.name / plan.revision
        if CONFIG_NAME not in plan.files:
            raise WeightsError(f"model {req.name}: {CONFIG_NAME} is not in the file list of {req.source}")
        if plan.revision != req.revision and (done := _already_staged(req, plan.revision)) is not None:
            emit("already_staged", path=str(final))
            return done
        staging = root / req.name / f"{STAGING_PREFIX}{plan.revision}"
        needed = space_needed(plan.files, dir_sizes(staging, parts=True))
        if not plan.same_device:
            _make_room(req, plan.revision, needed)
        emit("plan", revision=plan.revision, files=len(plan.files), total=sum(plan.files.values()), needed=needed)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            with _Poller(staging, sum(plan.files.values())):
                fetch_source(req, plan, staging, token)
            return _finalize(req, plan, staging, final)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # keep what was fetched: a rerun resumes it
                raise _disk_full(req, plan, staging) from exc
            raise WeightsError(f"model {req.name}: staging failed: {exc}") from exc


def _make_room(req: StageRequest, revision: str, needed: int) -> None:
    """Check the space, counting old revisions the keep-N cleanup would remove anyway; when the disk
    is short, remove those first (oldest first, no more than needed). Protected ones never go."""
    root = Path(req.root)
    where = f"model {req.name} under {root}"
    free = free_bytes(str(root))
    short = needed + req.reserve_bytes - free
    doomed: list[StagedRevision] = []
    if short > 0 and req.keep_revisions > 0:
        incoming = StagedRevision(req.name, revision, float("inf"))
        protected = read_protected(root) | in_units(req.unit_dir, root)
        doomed = reclaim_for(
            staged_revisions(root), keep=req.keep_revisions, protected=protected, incoming=incoming, needed=short
        )
    check_space(needed, free, where=where, reserve=req.reserve_bytes, reclaimable=sum(s.bytes for s in doomed))
    for s in doomed:
        emit("cleanup", name=s.name, revision=s.revision, bytes=s.bytes, reason="room for staging")
        remove(str(root), s.name, s.revision)


def _disk_full(req: StageRequest, plan: SourcePlan, staging: Path) -> WeightsError:
    needed = space_needed(plan.files, dir_sizes(staging, parts=True))
    free = free_bytes(str(staging))
    what = (
        f"needs {fmt_bytes(needed)} more ({needed} bytes)"
        if needed
        else "every file is fetched but the manifest cannot be written"
    )
    return WeightsError(
        f"model {req.name}: disk full under {staging} while staging: {what}, "
        f"{fmt_bytes(free)} free ({free} bytes); the partial download is kept and a rerun "
        "resumes it"
    )


def _already_staged(req: StageRequest, revision: str) -> Manifest | None:
    try:
        return verify_staged(req.root, req.name, revision)
    except WeightsError as exc:
        emit("restage", reason=str(exc))
        final = Path(req.root) / req.name / revision
        staging = final.with_name(f"{STAGING_PREFIX}{revision}")
        (final / MANIFEST_NAME).unlink(missing_ok=True)
        if staging.exists():
            shutil.rmtree(final)
        else:  # keep its files: the fetch reuses those whose size is right
            final.rename(staging)
        return None


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def _finalize(req: StageRequest, plan: SourcePlan, staging: Path, final: Path) -> Manifest:
    for leftover in staging.rglob(f"*{PART_SUFFIX}"):
        leftover.unlink()
    index = read_index(staging, plan.files)
    verified = verify_model(
        staging,
        where=f"model {req.name} ({staging})",
        expected=plan.files,
        sha256=plan.sha256,
        already_hashed=plan.hashed,
    )
    emit("verified", path=str(final), **verified.to_dict())
    manifest = Manifest(
        name=req.name,
        repo=req.repo,
        revision=plan.revision,
        files=dict(plan.files),
        source=req.source,
        staged_at=time.time(),
        path=str(final),
        index_sha256=sha256_file(staging / INDEX_NAME) if index is not None else None,
        requested_revision=None if req.revision == plan.revision else req.revision,
        sha256=plan.sha256,
    )
    write_atomic(staging / MANIFEST_NAME, json.dumps(manifest.to_dict(), indent=1).encode())
    os.rename(staging, final)
    fsync_dir(final.parent)
    return manifest


def staged_revisions(root: Path) -> list[StagedRevision]:
    """Every complete staged revision under root, with its size (partial ones are never listed)."""
    return [
        StagedRevision(str(e["name"]), str(e["revision"]), float(str(e["staged_at"])), int(str(e["bytes"])))
        for e in list_staged(str(root))
        if not e.get("partial")
    ]


def read_protected(root: Path) -> set[tuple[str, str]]:
    """(name, revision) pairs the last cleanup was told never to remove (serving, previous stable)."""
    try:
        raw = json.loads((root / PROTECT_NAME).read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{root / PROTECT_NAME} cannot be read: {exc}") from exc
    pairs = raw.get("protected") if isinstance(raw, dict) else None
    if not isinstance(pairs, list):
        raise WeightsError(f"{root / PROTECT_NAME}: no list of protected revisions")
    return {(str(p[0]), str(p[1])) for p in pairs if isinstance(p, list) and len(p) == 2}


def in_units(unit_dir: str | None, root: Path) -> set[tuple[str, str]]:
    """Revisions under root that an installed engine unit names (read from the unit files on disk)."""
    pairs: set[tuple[str, str]] = set()
    found = {u for e in ENGINES.values() for u in Path(unit_dir).glob(e.unit_name("*"))} if unit_dir else set()
    for unit in sorted(found):
        try:
            pairs |= revisions_named_in(unit.read_text(errors="replace"), str(root))
        except OSError as exc:  # unreadable: better to remove nothing
            raise WeightsError(f"{unit}: cannot be read to see which weights it uses: {exc.strerror}") from exc
    return pairs


def cleanup(root: str, keep: int, protected: set[tuple[str, str]], unit_dir: str | None = None) -> list[StagedRevision]:
    """Record the protected revisions on the host (staging reads them), then keep the ``keep`` newest
    revisions of each model and remove the rest; never a protected one, nor one an installed unit
    under ``unit_dir`` names."""
    base = Path(root)
    if not base.is_dir():
        return []
    with _root_lock(base):
        write_atomic(base / PROTECT_NAME, json.dumps({"protected": sorted([n, r] for n, r in protected)}).encode())
        doomed = plan_cleanup(staged_revisions(base), keep=keep, protected=protected | in_units(unit_dir, base))
        for s in doomed:
            emit("cleanup", name=s.name, revision=s.revision, bytes=s.bytes, reason=f"keep {keep}")
            remove(root, s.name, s.revision)
        return doomed


def remove(root: str, name: str, revision: str) -> bool:
    """Unstage first (manifest gone), then delete, so a half-deleted model is never taken as staged."""
    base = Path(root) / name
    found = False
    for d in (base / revision, base / f"{STAGING_PREFIX}{revision}"):
        if d.exists():
            found = True
            (d / MANIFEST_NAME).unlink(missing_ok=True)
            shutil.rmtree(d)
    _rmdir_if_empty(base)
    return found


def list_staged(root: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    base = Path(root)
    for model_dir in sorted(base.iterdir()) if base.is_dir() else []:
        for rev_dir in sorted(model_dir.iterdir()) if model_dir.is_dir() else []:
            if rev_dir.name.startswith(STAGING_PREFIX):
                out.append(
                    {
                        "name": model_dir.name,
                        "revision": rev_dir.name[len(STAGING_PREFIX) :],
                        "partial": True,
                        "bytes": tree_bytes(rev_dir),
                    }
                )
            elif is_commit_sha(rev_dir.name):
                try:
                    m = read_manifest(rev_dir)
                except WeightsError as exc:  # listed, never counted as staged
                    out.append(
                        {
                            "name": model_dir.name,
                            "revision": rev_dir.name,
                            "partial": True,
                            "broken": str(exc),
                            "bytes": tree_bytes(rev_dir),
                        }
                    )
                    continue
                if m is not None:
                    out.append(
                        {
                            "name": m.name,
                            "revision": m.revision,
                            "partial": False,
                            "bytes": m.total_bytes,
                            "staged_at": m.staged_at,
                        }
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.worker.stage")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stage").add_argument("request", help="StageRequest as JSON")
    sub.add_parser("check", help="verify a model directory used in place (local:/dir)").add_argument("path")
    for cmd in ("verify", "remove"):
        p = sub.add_parser(cmd)
        p.add_argument("root")
        p.add_argument("name")
        p.add_argument("revision")
    sub.add_parser("list").add_argument("root")
    p = sub.add_parser("cleanup")
    p.add_argument("root")
    p.add_argument("keep", type=int)
    p.add_argument("protected", help="JSON list of [name, revision] pairs never to remove")
    p.add_argument("--unit-dir", help="installed units here name revisions that are in use")
    sub.add_parser("free").add_argument("path")
    args = parser.parse_args(argv)
    _quiet_hub_library()
    try:
        if args.cmd == "stage":
            try:
                req = StageRequest.from_dict(json.loads(args.request))
            except ValueError as exc:
                raise WeightsError(f"stage request is not JSON: {exc}") from exc
            emit("done", manifest=stage(req).to_dict())
        elif args.cmd == "check":
            emit("done", path=args.path, **verify_in_place(Path(args.path), where=args.path).to_dict())
        elif args.cmd == "verify":
            m = verify_staged(args.root, args.name, args.revision)
            emit("done", manifest=None if m is None else m.to_dict())
        elif args.cmd == "remove":
            emit("done", removed=remove(args.root, args.name, args.revision))
        elif args.cmd == "list":
            emit("done", staged=list_staged(args.root))
        elif args.cmd == "cleanup":
            try:
                pairs = {(str(n), str(r)) for n, r in json.loads(args.protected)}
            except (ValueError, TypeError) as exc:
                raise WeightsError(f"cleanup: protected revisions are not a JSON list of pairs: {exc}") from exc
            removed = cleanup(args.root, args.keep, pairs, args.unit_dir)
            emit(
                "done",
                removed=[
                    {"name": s.name, "revision": s.revision, "bytes": s.bytes, "staged_at": s.staged_at}
                    for s in removed
                ],
            )
        else:
            emit("done", path=args.path, free_bytes=free_bytes(args.path))
    except WeightsError as exc:
        emit("error", message=str(exc))
        return EXIT_WEIGHTS
    return 0


def _quiet_hub_library() -> None:
    """No progress bars or warnings on stderr (read by huggingface_hub at import): progress goes out
    as JSON lines."""
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
