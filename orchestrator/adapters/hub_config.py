"""A model's config.json (and safetensors index) for `plan`: from disk, a local cache, or the hub.

Planning must work on a laptop with no route to the hub, and must never hang on one: every config
fetched is kept under ``$XDG_CACHE_HOME/orchestrator/configs`` (default ``~/.cache``), keyed by repo
and revision, and read from there first; the hub is asked once, without retries, with short
timeouts, and a failure is one line naming the endpoint and what to do instead.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator import resources, userfiles
from orchestrator.core.documents import DocumentError, json_document
from orchestrator.core.planner_arch import check_model_config
from orchestrator.core.weights import CONFIG_NAME, INDEX_NAME
from orchestrator.errors import TransportError, UsageError

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT = httpx.Timeout(15.0, connect=5.0)


@dataclass(frozen=True)
class ModelConfig:
    """config.json as parsed, the index when known, and where both came from (shown to the user)."""

    config: dict[str, Any]
    index: dict[str, Any] | None
    source: str


def read_json_file(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from a file; UsageError naming the file and what is wrong with it."""
    try:
        raw = resources.shipped_config(path)  # the package's own: read once per process
        data = json_document(userfiles.read_bytes(path) if raw is None else raw, str(path), unique_keys=False)
    except FileNotFoundError as exc:
        raise UsageError(f"{what} {path}: file not found") from exc
    except IsADirectoryError as exc:
        raise UsageError(f"{what} {path}: is a directory, not a file") from exc
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot read: {exc.strerror}") from exc
    except DocumentError as exc:
        raise UsageError(f"{what} {path}: {exc.reason}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_model_config(path: str | Path, what: str) -> dict[str, Any]:
    """A model's config.json from a file: read_json_file's checks, then the fields an engine builds it from
    (ConfigError naming the file, the field and the value)."""
    data = read_json_file(path, what)
    check_model_config(data, str(path))
    return data


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orchestrator" / "configs"


def cache_dir(repo: str, revision: str) -> Path:
    """One directory per repo@revision; quoting keeps any repo or revision text in one path part."""
    return cache_root() / f"{quote(repo, safe='')}@{quote(revision, safe='')}"


def from_cache(repo: str, revision: str) -> ModelConfig | None:
    folder = cache_dir(repo, revision)
    config_file = folder / CONFIG_NAME
    if not config_file.is_file():
        return None
    config = read_model_config(config_file, "cached config")
    index_file = folder / INDEX_NAME
    index = read_json_file(index_file, "cached index") if index_file.is_file() else None
    fetched = time.strftime("%Y-%m-%d", time.localtime(config_file.stat().st_mtime))
    return ModelConfig(config, index, f"cached copy of {repo}@{revision} from {fetched} ({folder})")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _token() -> str | None:
    token = os.environ.get("HF_TOKEN")
    if token:
        return token
    from huggingface_hub import get_token

    return get_token()


def _get(client: httpx.Client, repo: str, revision: str, name: str) -> bytes | None:
    """One file from the hub, or None when the hub says it does not exist; errors are one line."""
    url = f"{endpoint()}/{quote(repo)}/resolve/{quote(revision, safe='')}/{name}"
    where = f"{name} of {repo}@{revision}"
    try:
        response = client.get(url)
    except httpx.TransportError as exc:  # DNS, refused, timeout, TLS: no retry, say so at once
        reason = str(exc) or type(exc).__name__
        raise TransportError(f"cannot fetch {where}: the hub at {endpoint()} cannot be reached ({reason})") from exc
    code = response.headers.get("X-Error-Code", "")
    if response.status_code == 200:
        return response.content
    if response.status_code == 404 and code == "EntryNotFound":
        return None
    if response.status_code == 404 and code == "RevisionNotFound":
        raise UsageError(f"cannot fetch {where}: revision {revision!r} does not exist on the hub")
    if response.status_code in (401, 403, 404):
        hint = "the repo does not exist, or it is gated or private and HF_TOKEN is missing or not accepted"
        raise UsageError(f"cannot fetch {where}: the hub answered HTTP {response.status_code}: {hint}")
    raise TransportError(f"cannot fetch {where}: the hub at {endpoint()} answered HTTP {response.status_code}")


def from_hub(repo: str, revision: str) -> ModelConfig:
    """Fetch config.json (and the index when there is one) and keep a copy in the cache."""
    token = _token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True, headers=headers) as client:
        raw_config = _get(client, repo, revision, CONFIG_NAME)
        if raw_config is None:
            raise UsageError(f"{repo}@{revision} has no {CONFIG_NAME} on the hub")
        raw_index = _get(client, repo, revision, INDEX_NAME)
    config = _parse(raw_config, f"{CONFIG_NAME} of {repo}@{revision} from the hub")
    check_model_config(config, f"{CONFIG_NAME} of {repo}@{revision} from the hub")
    index = None if raw_index is None else _parse(raw_index, f"{INDEX_NAME} of {repo}@{revision} from the hub")
    note = _store(repo, revision, {CONFIG_NAME: raw_config, **({INDEX_NAME: raw_index} if raw_index else {})})
    return ModelConfig(config, index, f"{repo}@{revision} from the hub at {endpoint()}{note}")


def _parse(raw: bytes, what: str) -> dict[str, Any]:
    try:
        data = json_document(raw, what, unique_keys=False)
    except DocumentError as exc:
        raise UsageError(f"{what}: {exc.reason}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _store(repo: str, revision: str, files: dict[str, bytes]) -> str:
    """Write the files atomically into the cache; a cache that cannot be written only costs a note."""
    folder = cache_dir(repo, revision)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            userfiles.write_atomic(folder / name, data)
    except OSError as exc:
        return f" (not cached: {folder}: {exc.strerror})"
    return f", cached in {folder}"
