"""Where the stage worker gets weights from: the hub, a local directory, or a peer host over SSH.

Each source first plans (commit, file sizes, and whether it costs disk space), then fetches into the
staging directory; ``orchestrator.worker.stage`` verifies and finalizes. huggingface_hub 2.x downloads
each file to a process-unique temp file that a killed process never resumes, so hub files are fetched
with its ``http_get(resume_size=...)`` into our own ``.part`` files. huggingface_hub is imported
lazily: the worker quiets it (environment variables read at import) first.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.core.weights import (
    CONFIG_NAME,
    INDEX_NAME,
    MANIFEST_NAME,
    PART_SUFFIX,
    Manifest,
    StageRequest,
    check_file_names,
    index_shards,
)
from orchestrator.errors import WeightsError
from orchestrator.worker.files import (
    HashingWriter,
    dir_sizes,
    emit,
    inside,
    read_index,
    read_manifest,
    set_current_file,
)
from orchestrator.worker.verify import cache_blob_sha256


class SourcePlan:
    """What a source will deliver: the commit, file sizes and whether it costs no disk space."""

    def __init__(
        self,
        revision: str,
        files: dict[str, int],
        *,
        sha256: dict[str, str] | None = None,
        same_device: bool = False,
        context: object = None,
    ) -> None:
        self.revision, self.files, self.sha256 = revision, files, sha256 or {}
        self.same_device, self.context = same_device, context
        self.hashed: set[str] = set()  # files whose sha256 was checked while they were fetched


Planner = Callable[[StageRequest, str | None], SourcePlan]
Fetcher = Callable[[StageRequest, SourcePlan, Path, str | None], None]


def plan_source(req: StageRequest, token: str | None) -> SourcePlan:
    """What the request's source (hub, local directory or peer host) will deliver; every file name
    it lists is checked to stay inside the model directory before anything is written."""
    plan = _PLANNERS[req.source_kind](req, token)
    check_file_names([*plan.files, *plan.sha256], repo=req.repo, where=f"model {req.name} (from {req.source})")
    return plan


def fetch_source(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    """Fetch the planned files into staging; sizes are verified by the caller."""
    _FETCHERS[req.source_kind](req, plan, staging, token)


def check_index_against_listing(index: object, files: Mapping[str, int], where: str) -> None:
    """Fail before the big downloads when the index names a shard the source does not have."""
    missing = sorted(index_shards(index, where=where) - set(files))
    if missing:
        raise WeightsError(
            f"{where}: shard {', '.join(missing)} named in {INDEX_NAME} is not in the "
            "file list (missing on the source, or excluded by a pattern)"
        )
    if CONFIG_NAME not in files:
        raise WeightsError(f"{where}: {CONFIG_NAME} is not in the file list")


def _hub_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub raises for the hub's answers and for the network under it (its own
    re-export of its HTTP client, stable across the hub's major versions)."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled
    from huggingface_hub.utils import httpx  # type: ignore[attr-defined]

    return (HfHubHTTPError, OfflineModeIsEnabled, httpx.RequestError)


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
        return WeightsError(
            f"{what}: the hub answered HTTP {status}: the repo is gated or private and the "
            f"token from {origin} is missing or not accepted"
        )
    if file and (isinstance(exc, RemoteEntryNotFoundError) or status == 404):
        return WeightsError(
            f"{what}: listed by the hub but not served (HTTP 404): "
            f"{file} is missing (expected {size} bytes, found none)"
        )
    if isinstance(exc, RevisionNotFoundError):
        return WeightsError(f"{what}: revision {req.revision!r} does not exist on the hub")
    if isinstance(exc, RepositoryNotFoundError):
        return WeightsError(f"{what}: the repo does not exist on the hub")
    if status is not None:
        return WeightsError(f"{what}: the hub answered HTTP {status}")
    return WeightsError(
        f"{what}: the hub at {req.endpoint or 'the default endpoint'} cannot be reached: {type(exc).__name__}: {exc}"
    )


def _plan_hub(req: StageRequest, token: str | None) -> SourcePlan:
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]

    try:
        info = HfApi(endpoint=req.endpoint, token=token or False).model_info(
            req.repo, revision=req.revision, files_metadata=True
        )
    except _hub_errors() as exc:
        raise _hub_error(req, exc) from exc
    siblings = info.siblings or []
    unsized = [s.rfilename for s in siblings if s.size is None]
    if unsized or not info.sha:
        raise WeightsError(f"model {req.name}: the hub gave no commit or no sizes for {unsized[:3]}")
    names = filter_repo_objects(
        [s.rfilename for s in siblings],
        allow_patterns=list(req.allow_patterns) or None,
        ignore_patterns=list(req.ignore_patterns) or None,
    )
    wanted = set(names)
    files = {s.rfilename: int(s.size or 0) for s in siblings if s.rfilename in wanted}
    sha256 = {s.rfilename: s.lfs.sha256 for s in siblings if s.lfs is not None and s.rfilename in wanted}
    return SourcePlan(info.sha, files, sha256=sha256)


def _fetch_hub(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    first = [n for n in (CONFIG_NAME, INDEX_NAME) if n in plan.files]
    for name in first + sorted(n for n in plan.files if n not in first):
        set_current_file(name)
        _fetch_hub_file(req, plan, staging, token, name)
        if name == INDEX_NAME:
            check_index_against_listing(read_index(staging, plan.files), plan.files, f"model {req.name}")
        emit("file_done", file=name, size=plan.files[name])


def _fetch_hub_file(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None, name: str) -> None:
    """Fetch one file through a .part file, hashing as it is written (and the kept part on a resume);
    a file whose sha256 is not the listed one is fetched once more from scratch, then refused."""
    where = f"model {req.name} (from {req.source})"
    size, dest = plan.files[name], inside(staging, name, repo=req.repo, where=where)
    if dest.is_file() and dest.stat().st_size == size:
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = inside(staging, name + PART_SUFFIX, repo=req.repo, where=where)
    expected = plan.sha256.get(name)
    actual = _download(req, plan, part, token, name)
    if expected is not None and actual != expected:
        emit("sha256_mismatch", file=name, expected=expected, actual=actual, retry=True)
        part.unlink()
        actual = _download(req, plan, part, token, name)
        if actual != expected:
            part.unlink()
            raise WeightsError(
                f"model {req.name} ({req.repo}@{plan.revision}): {name} failed its sha256 "
                f"check twice (expected {expected}, actual {actual}); the hub or a proxy "
                "serves corrupted bytes"
            )
    os.replace(part, dest)
    if expected is not None:
        plan.hashed.add(name)


def _download(req: StageRequest, plan: SourcePlan, part: Path, token: str | None, name: str) -> str:
    """Complete ``part`` (resuming after the bytes it holds) and return the sha256 of the whole file."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

    size = plan.files[name]
    url = hf_hub_url(req.repo, name, revision=plan.revision, endpoint=req.endpoint)
    try:
        meta = get_hf_file_metadata(url, token=token or False, endpoint=req.endpoint)
        if meta.size is not None and meta.size != size:
            raise WeightsError(
                f"model {req.name}: {name} has the wrong size on the hub (expected {size} "
                f"bytes as listed, found {meta.size} served)"
            )
        headers = strip_auth_off_host(url, meta.location, build_hf_headers(token=token or False))
        have = part.stat().st_size if part.exists() else 0
        have = have if have <= size else 0
        with open(part, "r+b" if part.exists() else "w+b") as f:
            f.truncate(have)
            writer = HashingWriter(f, have=have)  # a resume hashes the part it keeps
            if have:
                emit("resume", file=name, offset=have)
            http_get(
                meta.location,
                writer,  # type: ignore[arg-type]
                resume_size=have,
                headers=headers,
                expected_size=size,
                displayed_filename=name,
            )
            f.flush()
            os.fsync(f.fileno())
            return writer.hexdigest()
    except _hub_errors() as exc:
        raise _hub_error(req, exc, name, size) from exc
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error (ENOSPC is handled by stage())
            raise
        found = part.stat().st_size if part.exists() else 0
        raise WeightsError(
            f"model {req.name}: {name} has the wrong size (expected {size} bytes, found {found})"
        ) from exc


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
    # The digests the copy is checked against: the source's manifest, or a hub cache's blob names.
    sha256 = m.sha256 if m is not None else cache_blob_sha256(src, files)
    return SourcePlan(req.revision, files, sha256=sha256, same_device=same)


def _fetch_local(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    """Hardlink when on the same filesystem (weights are immutable), else copy through a .part file."""
    src = Path(req.source_arg)
    where = f"model {req.name} (from {req.source})"
    for name, size in sorted(plan.files.items()):
        dest = inside(staging, name, repo=req.repo, where=where)
        if dest.is_file() and dest.stat().st_size == size:
            continue
        origin = (src / name).resolve()  # a Hugging Face cache snapshot holds symlinks into blobs/
        if not origin.is_file():
            continue  # verification names it as missing
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        set_current_file(name)
        try:
            os.link(origin, dest)
        except OSError:
            part = inside(staging, name + PART_SUFFIX, repo=req.repo, where=where)
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
    out = run_checked([*ssh, "--", target, "cat", shlex.quote(f"{remote}/{MANIFEST_NAME}")], what)
    try:
        m = Manifest.from_dict(json.loads(out))
    except ValueError as exc:
        raise WeightsError(f"{what}: not JSON: {exc}") from exc
    return SourcePlan(req.revision, dict(m.files), sha256=m.sha256)


def _fetch_peer(req: StageRequest, plan: SourcePlan, staging: Path, token: str | None) -> None:
    ssh, target, remote = _peer_ssh(req)
    # -rt, not -a: no symlinks, devices, owners or modes from the peer land under the staging dir;
    # --protect-args: the remote path goes over the protocol, never through the peer's shell.
    run_checked(
        [
            "rsync",
            "-rt",
            "--protect-args",
            "--partial-dir=.rsync-partial",
            f"--exclude=/{MANIFEST_NAME}",
            "-e",
            shlex.join(ssh),
            "--",
            f"{target}:{remote}/",
            f"{staging}/",
        ],
        f"model {req.name}: rsync from {req.source_arg}",
    )
    shutil.rmtree(staging / ".rsync-partial", ignore_errors=True)


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


_PLANNERS: dict[str, Planner] = {"hub": _plan_hub, "local": _plan_local, "host": _plan_peer}
_FETCHERS: dict[str, Fetcher] = {"hub": _fetch_hub, "local": _fetch_local, "host": _fetch_peer}
