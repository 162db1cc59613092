"""Stage model weights on the host that needs them: ``python -m orchestrator.stage_worker CMD ...``.

Runs locally or over SSH; prints one JSON object per line on stdout (``progress``, ``file_done``,
``done`` with the manifest, or ``error``) so the controller can stream byte progress. Files go to
``<root>/<name>/.staging-<sha>/`` and the directory is renamed to ``<root>/<name>/<sha>/`` only after
verification and an atomic manifest write, so a partial model is never taken as staged.

The hub token comes from HF_TOKEN or a root-only file; it is never printed (every line is scrubbed).
huggingface_hub 2.x downloads each file to a process-unique temp file that a killed process never
resumes, so files are fetched here with its ``http_get(resume_size=...)`` into our own ``.part`` files.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Self
from urllib.parse import urlparse

from orchestrator.core.weights import (
    CONFIG_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    PART_SUFFIX,
    STAGING_PREFIX,
    Manifest,
    StageRequest,
    check_space,
    index_shards,
    is_commit_sha,
    space_needed,
    verify_listing,
)
from orchestrator.errors import WeightsError

EXIT_WEIGHTS = 3
_SECRETS: list[str] = []
_OUT_LOCK = threading.Lock()
_CURRENT = {"file": ""}  # the file being fetched, for progress lines


def emit(event: str, **fields: object) -> None:
    """One JSON line on stdout, with every known secret replaced."""
    line = json.dumps({"event": event, **fields}, sort_keys=True)
    for secret in _SECRETS:
        line = line.replace(secret, "***")
    with _OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def load_token(token_file: str | None) -> str | None:
    """The hub token from a root-only file, else HF_TOKEN, else none (public repos); registered
    for scrubbing. A missing file is no token; an unreadable or world-readable one is an error."""
    token: str | None = None
    if token_file and os.path.exists(token_file):
        try:
            st = os.stat(token_file)
            if st.st_mode & 0o077:
                raise WeightsError(f"token file {token_file} has mode {stat.S_IMODE(st.st_mode):o}; "
                                   "it must be readable by its owner only (chmod 600)")
            token = Path(token_file).read_text().strip() or None
        except OSError as exc:
            raise WeightsError(f"token file {token_file} cannot be read: {exc.strerror}") from exc
    token = token or os.environ.get("HF_TOKEN") or None
    if token:
        _SECRETS.append(token)
    return token


def dir_sizes(base: Path, *, parts: bool = False) -> dict[str, int]:
    """Relative path -> size of the model files under base (hidden top-level entries skipped).
    With ``parts``, a ``.part`` file counts under its final name (bytes a resume keeps)."""
    sizes: dict[str, int] = {}
    if not base.is_dir():
        return sizes
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = Path(dirpath).relative_to(base)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for fn in filenames:
            rel = (rel_dir / fn).as_posix()
            if rel_dir == Path(".") and fn.startswith("."):
                continue
            size = os.stat(os.path.join(dirpath, fn)).st_size
            if fn.endswith(PART_SUFFIX):
                if parts:
                    sizes.setdefault(rel[: -len(PART_SUFFIX)], size)
            else:
                sizes[rel] = size
    return sizes


def tree_bytes(base: Path) -> int:
    return sum(os.stat(os.path.join(d, f)).st_size for d, _, fs in os.walk(base) for f in fs)


def free_bytes(path: str) -> int:
    """Bytes available to root under path (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists():
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_index(base: Path, files: Mapping[str, int]) -> object | None:
    if INDEX_NAME not in files:
        return None
    try:
        index: object = json.loads((base / INDEX_NAME).read_text())
        return index
    except (OSError, ValueError) as exc:
        raise WeightsError(f"{base}: {INDEX_NAME} cannot be read: {exc}") from exc


def read_manifest(model_dir: Path) -> Manifest | None:
    try:
        raw = (model_dir / MANIFEST_NAME).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise WeightsError(f"{model_dir}: manifest cannot be read: {exc.strerror}") from exc
    try:
        return Manifest.from_dict(json.loads(raw))
    except ValueError as exc:
        raise WeightsError(f"{model_dir}: manifest is not JSON: {exc}") from exc


def verify_staged(root: str, name: str, revision: str) -> Manifest | None:
    """The manifest of a staged model whose files still match it; None when it is not staged."""
    final = Path(root) / name / revision
    manifest = read_manifest(final)
    if manifest is None:
        return None
    index = _read_index(final, manifest.files)
    if index is not None and manifest.index_sha256 != _sha256_file(final / INDEX_NAME):
        raise WeightsError(f"{final}: {INDEX_NAME} changed since it was staged")
    verify_listing(manifest.files, dir_sizes(final), index, where=str(final))
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
            emit("progress", bytes=done, total=self.total, file=_CURRENT["file"])

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
        plan = {"hub": _plan_hub, "local": _plan_local, "host": _plan_peer}[req.source_kind](req, token)
        final = root / req.name / plan.revision
        if CONFIG_NAME not in plan.files:
            raise WeightsError(f"model {req.name}: {CONFIG_NAME} is not in the file list of {req.source}")
        if plan.revision != req.revision and (done := _already_staged(req, plan.revision)) is not None:
            emit("already_staged", path=str(final))
            return done
        staging = root / req.name / f"{STAGING_PREFIX}{plan.revision}"
        needed = space_needed(plan.files, dir_sizes(staging, parts=True))
        if not plan.same_device:
            check_space(needed, free_bytes(str(root)), where=f"model {req.name} under {root}",
                        reserve=req.reserve_bytes)
        emit("plan", revision=plan.revision, files=len(plan.files), total=sum(plan.files.values()),
             needed=needed)
        staging.mkdir(parents=True, exist_ok=True)
        try:
            with _Poller(staging, sum(plan.files.values())):
                {"hub": _fetch_hub, "local": _fetch_local, "host": _fetch_peer}[req.source_kind](
                    req, plan, staging, token)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # ENOSPC: no half-written model may stay behind on a full disk
                shutil.rmtree(staging, ignore_errors=True)
                _rmdir_if_empty(root / req.name)
                raise WeightsError(f"model {req.name}: disk full under {root} while staging; "
                                   "the partial download was removed") from exc
            raise WeightsError(f"model {req.name}: staging failed: {exc}") from exc
        return _finalize(req, plan, staging, final)


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
    index = _read_index(staging, plan.files)
    verify_listing(plan.files, dir_sizes(staging), index, where=f"model {req.name} ({staging})")
    manifest = Manifest(
        name=req.name, repo=req.repo, revision=plan.revision, files=dict(plan.files), source=req.source,
        staged_at=time.time(), path=str(final),
        index_sha256=_sha256_file(staging / INDEX_NAME) if index is not None else None,
        requested_revision=None if req.revision == plan.revision else req.revision, sha256=plan.sha256)
    _write_atomic(staging / MANIFEST_NAME, json.dumps(manifest.to_dict(), indent=1).encode())
    os.rename(staging, final)
    _fsync_dir(final.parent)
    return manifest


class SourcePlan:
    """What a source will deliver: the commit, file sizes and whether it costs no disk space."""

    def __init__(self, revision: str, files: dict[str, int], *, sha256: dict[str, str] | None = None,
                 same_device: bool = False, context: object = None) -> None:
        self.revision, self.files, self.sha256 = revision, files, sha256 or {}
        self.same_device, self.context = same_device, context


def check_index_against_listing(index: object, files: Mapping[str, int], where: str) -> None:
    """Fail before the big downloads when the index names a shard the source does not have."""
    missing = sorted(index_shards(index, where=where) - set(files))
    if missing:
        raise WeightsError(f"{where}: shard {', '.join(missing)} named in {INDEX_NAME} is not in the "
                           "file list (missing on the source, or excluded by a pattern)")
    if CONFIG_NAME not in files:
        raise WeightsError(f"{where}: {CONFIG_NAME} is not in the file list")


def _hub_error(req: StageRequest, exc: Exception, file: str | None = None, size: int = 0) -> WeightsError:
    from huggingface_hub.errors import (
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    what = f"model {req.name} ({req.repo}@{req.revision}" + (f", file {file})" if file else ")")
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        origin = f"token file {req.token_file}" if req.token_file else "HF_TOKEN"
        return WeightsError(f"{what}: the hub answered HTTP {status}: the repo is gated or private and the "
                            f"token from {origin} is missing or not accepted")
    if file and (isinstance(exc, RemoteEntryNotFoundError) or status == 404):
        return WeightsError(f"{what}: listed by the hub but not served (HTTP 404): "
                            f"{file} is missing (expected {size} bytes, found none)")
    if isinstance(exc, RevisionNotFoundError):
        return WeightsError(f"{what}: revision {req.revision!r} does not exist on the hub")
    if isinstance(exc, RepositoryNotFoundError):
        return WeightsError(f"{what}: the repo does not exist on the hub")
    if status is not None:
        return WeightsError(f"{what}: the hub answered HTTP {status}")
    return WeightsError(f"{what}: the hub at {req.endpoint or 'the default endpoint'} cannot be reached: "
                        f"{type(exc).__name__}: {exc}")


def _plan_hub(req: StageRequest, token: str | None) -> SourcePlan:
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]
    try:
        info = HfApi(endpoint=req.endpoint, token=token or False).model_info(
            req.repo, revision=req.revision, files_metadata=True)
    except httpx2.HTTPError as exc:  # HfHubHTTPError included
        raise _hub_error(req, exc) from exc
    siblings = info.siblings or []
    unsized = [s.rfilename for s in siblings if s.size is None]
    if unsized or not info.sha:
        raise WeightsError(f"model {req.name}: the hub gave no commit or no sizes for {unsized[:3]}")
    names = filter_repo_objects([s.rfilename for s in siblings],
                                allow_patterns=list(req.allow_patterns) or None,
                                ignore_patterns=list(req.ignore_patterns) or None)
    wanted = set(names)
    files = {s.rfilename: int(s.size or 0) for s in siblings if s.rfilename in wanted}
    sha256 = {s.rfilename: s.lfs.sha256 for s in siblings if s.lfs is not None and s.rfilename in wanted}
    return SourcePlan(info.sha, files, sha256=sha256)


def _fetch_hub(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    first = [n for n in (CONFIG_NAME, INDEX_NAME) if n in plan.files]
    for name in first + sorted(n for n in plan.files if n not in first):
        _CURRENT["file"] = name
        _fetch_hub_file(req, plan, staging, token, name)
        if name == INDEX_NAME:
            check_index_against_listing(_read_index(staging, plan.files), plan.files, f"model {req.name}")
        emit("file_done", file=name, size=plan.files[name])


def _fetch_hub_file(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None,
                    name: str) -> None:
    import httpx2
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]
    size, dest = plan.files[name], staging / name
    if dest.is_file() and dest.stat().st_size == size:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + PART_SUFFIX)
    url = hf_hub_url(req.repo, name, revision=plan.revision, endpoint=req.endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token or False, endpoint=req.endpoint)
        if meta.size is not None and meta.size != size:
            raise WeightsError(f"model {req.name}: {name} has the wrong size on the hub (expected {size} "
                               f"bytes as listed, found {meta.size} served)")
        headers = strip_auth_off_host(url, meta.location, build_hf_headers(token=token or False))
        have = part.stat().st_size if part.exists() else 0
        have = have if have <= size else 0
        with open(part, "r+b" if part.exists() else "wb") as f:
            f.truncate(have)
            f.seek(have)
            if have:
                emit("resume", file=name, offset=have)
            http_get(meta.location, f, resume_size=have, headers=headers, expected_size=size,
                     displayed_filename=name)
            f.flush()
            os.fsync(f.fileno())
    except httpx2.HTTPError as exc:  # HfHubHTTPError included (it is also an OSError)
        raise _hub_error(req, exc, name, size) from exc
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error (ENOSPC is handled by stage())
            raise
        found = part.stat().st_size if part.exists() else 0
        raise WeightsError(f"model {req.name}: {name} has the wrong size (expected {size} bytes, "
                           f"found {found})") from exc
    os.replace(part, dest)


def _plan_local(req: StageRequest, token: str | None) -> SourcePlan:
    src = Path(req.source_arg)
    if not src.is_dir():
        raise WeightsError(f"model {req.name}: source directory {src} does not exist")
    m = read_manifest(src)
    if m is not None and m.revision != req.revision:
        raise WeightsError(f"model {req.name}: {src} holds revision {m.revision}, not {req.revision}")
    files = dict(m.files) if m is not None else dir_sizes(src)
    root = Path(req.root)
    same = os.stat(src).st_dev == os.stat(root).st_dev
    return SourcePlan(req.revision, files, sha256=m.sha256 if m is not None else {}, same_device=same)


def _fetch_local(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    """Hardlink when on the same filesystem (weights are immutable), else copy through a .part file."""
    src = Path(req.source_arg)
    for name, size in sorted(plan.files.items()):
        dest = staging / name
        if dest.is_file() and dest.stat().st_size == size:
            continue
        origin = (src / name).resolve()  # a Hugging Face cache snapshot holds symlinks into blobs/
        if not origin.is_file():
            continue  # verification names it as missing
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        _CURRENT["file"] = name
        try:
            os.link(origin, dest)
        except OSError:
            part = dest.with_name(dest.name + PART_SUFFIX)
            shutil.copyfile(origin, part)
            os.replace(part, dest)
        emit("file_done", file=name, size=size)


def _peer_ssh(req: StageRequest) -> tuple[list[str], str, str]:
    peer = req.peer
    if peer is None:
        raise WeightsError(f"model {req.name}: source {req.source} has no peer details")
    ssh = ssh_command(peer.port, peer.key_file, peer.known_hosts)
    return ssh, f"{peer.user}@{peer.address}", f"{peer.root}/{req.name}/{req.revision}"


def _plan_peer(req: StageRequest, token: str | None) -> SourcePlan:
    ssh, target, remote = _peer_ssh(req)
    what = f"model {req.name}: reading {remote}/{MANIFEST_NAME} on {req.source_arg}"
    out = run_checked([*ssh, target, "cat", shlex.quote(f"{remote}/{MANIFEST_NAME}")], what)
    try:
        m = Manifest.from_dict(json.loads(out))
    except ValueError as exc:
        raise WeightsError(f"{what}: not JSON: {exc}") from exc
    return SourcePlan(req.revision, dict(m.files), sha256=m.sha256)


def _fetch_peer(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    ssh, target, remote = _peer_ssh(req)
    run_checked(["rsync", "-a", "--partial-dir=.rsync-partial", f"--exclude=/{MANIFEST_NAME}",
                 "-e", shlex.join(ssh), f"{target}:{remote}/", f"{staging}/"],
                f"model {req.name}: rsync from {req.source_arg}")
    shutil.rmtree(staging / ".rsync-partial", ignore_errors=True)


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
                out.append({"name": model_dir.name, "revision": rev_dir.name[len(STAGING_PREFIX):],
                            "partial": True, "bytes": tree_bytes(rev_dir)})
            elif is_commit_sha(rev_dir.name):
                try:
                    m = read_manifest(rev_dir)
                except WeightsError as exc:  # listed, never counted as staged
                    out.append({"name": model_dir.name, "revision": rev_dir.name, "partial": True,
                                "broken": str(exc), "bytes": tree_bytes(rev_dir)})
                    continue
                if m is not None:
                    out.append({"name": m.name, "revision": m.revision, "partial": False,
                                "bytes": m.total_bytes, "staged_at": m.staged_at})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.stage_worker")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stage").add_argument("request", help="StageRequest as JSON")
    for cmd in ("verify", "remove"):
        p = sub.add_parser(cmd)
        p.add_argument("root")
        p.add_argument("name")
        p.add_argument("revision")
    sub.add_parser("list").add_argument("root")
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
        elif args.cmd == "verify":
            m = verify_staged(args.root, args.name, args.revision)
            emit("done", manifest=None if m is None else m.to_dict())
        elif args.cmd == "remove":
            emit("done", removed=remove(args.root, args.name, args.revision))
        elif args.cmd == "list":
            emit("done", staged=list_staged(args.root))
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


def ssh_command(peer_port: int, key_file: str | None, known_hosts: str | None) -> list[str]:
    cmd = ["ssh", "-p", str(peer_port), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if key_file:
        cmd += ["-i", key_file, "-o", "IdentitiesOnly=yes"]
    if known_hosts:
        cmd += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return cmd


def run_checked(argv: list[str], what: str) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise WeightsError(f"{what}: {argv[0]} cannot run: {exc.strerror}") from exc
    if proc.returncode != 0 and "No space left on device" in proc.stderr:
        raise OSError(errno.ENOSPC, f"{what}: no space left on device")
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise WeightsError(f"{what}: {shlex.join(argv[:1])} exited {proc.returncode}: {tail}")
    return proc.stdout


def strip_auth_off_host(url: str, location: str, headers: dict[str, str]) -> dict[str, str]:
    """Like huggingface_hub: never send the token to a redirect target on another host (a CDN)."""
    if urlparse(location).netloc != urlparse(url).netloc:
        return {k: v for k, v in headers.items() if k.lower() != "authorization"}
    return headers


if __name__ == "__main__":
    sys.exit(main())
