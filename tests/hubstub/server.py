"""The hub endpoints huggingface_hub calls, on a loopback port, with a request log and fault knobs.

Served: GET /api/models/{repo}[/revision/{rev}] (model info: sha, siblings with sizes and LFS data),
GET /api/models/{repo}/tree/{rev} (recursive listing), HEAD/GET /{repo}/resolve/{rev}/{file}
(ETag, X-Repo-Commit, Content-Length, Range -> 206). A gated repo answers 401 without the right
Bearer token. Faults: a file listed but not served (404), a listed size that differs from the
served bytes, a stall after N bytes of one file (to kill a download mid-file), and corrupted bytes
(one flipped byte, at the listed size) for the first N GETs of a file or for all of them.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self
from urllib.parse import unquote, urlsplit


@dataclass
class StubFile:
    data: bytes | None  # None: listed by the API but 404 on resolve
    listed_size: int | None = None  # what the API reports, when it must differ from len(data)

    @property
    def size(self) -> int:
        if self.listed_size is not None:
            return self.listed_size
        return len(self.data or b"")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data or b"").hexdigest()


@dataclass
class StubRepo:
    repo_id: str
    sha: str
    files: dict[str, StubFile]
    token: str | None = None  # set: gated, this Bearer token is required
    branches: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, repo_id: str, files: dict[str, bytes], *, sha: str = "a" * 40, token: str | None = None) -> StubRepo:
        return cls(repo_id, sha, {k: StubFile(v) for k, v in files.items()}, token, {"main": sha})


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None
    status: int


class HubStub:
    """Start with ``with HubStub() as hub:``; ``hub.url`` is the HF_ENDPOINT."""

    def __init__(self, address: str = "127.0.0.1") -> None:
        self.repos: dict[str, StubRepo] = {}
        self.requests: list[Request] = []
        self.body_bytes: dict[str, int] = {}  # file path -> body bytes sent, over all GETs
        self._stall: tuple[str, int] | None = None
        self._corrupt: dict[str, int | None] = {}  # file -> GETs still served corrupted (None: all)
        self.stalled = threading.Event()
        self._release = threading.Event()
        self._lock = threading.Lock()
        stub = self

        class Handler(_Handler):
            hub = stub

        self._server = ThreadingHTTPServer((address, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, repo: StubRepo) -> StubRepo:
        self.repos[repo.repo_id] = repo
        return repo

    def stall(self, path: str, after_bytes: int) -> None:
        """GETs of ``path`` send ``after_bytes``, set ``stalled`` and wait for ``release()``."""
        self._stall = (path, after_bytes)
        self.stalled.clear()
        self._release.clear()

    def corrupt(self, path: str, times: int | None = 1) -> None:
        """Serve ``path`` with one byte flipped (same size) for the next ``times`` GETs; None: always."""
        self._corrupt[path] = times

    def _corrupted(self, path: str) -> bool:
        with self._lock:
            if path not in self._corrupt:
                return False
            left = self._corrupt[path]
            if left is not None:
                if left <= 0:
                    return False
                self._corrupt[path] = left - 1
            return True

    def release(self) -> None:
        self._stall = None
        self._release.set()

    def gets(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + path) and "/resolve/" in r.path]

    def log(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def count_body(self, path: str, n: int) -> None:
        with self._lock:
            self.body_bytes[path] = self.body_bytes.get(path, 0) + n

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)

    def _route(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        parts = path.strip("/").split("/")
        status = 404
        try:
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                status = self._api(parts[2] + "/" + parts[3], parts[4:])
            elif len(parts) >= 5 and parts[2] == "resolve":
                status = self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), head)
            else:
                status = self._error(404, "RepoNotFound", "not a hub route")
        except (BrokenPipeError, ConnectionResetError):
            status = 499  # the client went away (a killed worker)
            self.close_connection = True
        finally:
            self.hub.log(
                Request(self.command, path, self.headers.get("Range"), self.headers.get("Authorization"), status)
            )

    def _repo(self, repo_id: str) -> StubRepo | int:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(401, "RepoNotFound", f"Repository Not Found for url: {repo_id}")
        if repo.token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                return self._error(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You "
                    "must have access to it and be authenticated to access it.",
                )
            if auth != f"Bearer {repo.token}":
                return self._error(401, None, "Invalid credentials in Authorization header")
        return repo

    def _commit(self, repo: StubRepo, revision: str) -> str | None:
        if revision == repo.sha:
            return revision
        return repo.branches.get(revision)

    def _api(self, repo_id: str, rest: list[str]) -> int:
        repo = self._repo(repo_id)
        if isinstance(repo, int):
            return repo
        revision = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
        sha = self._commit(repo, revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        if rest and rest[0] == "tree":
            body: object = [
                {
                    "type": "file",
                    "oid": f.sha256[:40],
                    "size": f.size,
                    "path": name,
                    "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134},
                }
                for name, f in sorted(repo.files.items())
            ]
        else:
            body = {
                "_id": "0" * 24,
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": False,
                "gated": "manual" if repo.token else False,
                "disabled": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "lastModified": "2026-01-01T00:00:00.000Z",
                "siblings": [
                    {
                        "rfilename": name,
                        "size": f.size,
                        "blobId": f.sha256[:40],
                        "lfs": {"sha256": f.sha256, "size": f.size, "pointerSize": 134},
                    }
                    for name, f in sorted(repo.files.items())
                ],
            }
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return 200

    def _resolve(self, repo_id: str, revision: str, name: str, head: bool) -> int:
        repo = self._repo(repo_id)
        if isinstance(repo, int):
            return repo
        sha = self._commit(repo, revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        f = repo.files.get(name)
        if f is None or f.data is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on {revision}", sha)
        data, start, status = f.data, 0, 200
        if not head and self.hub._corrupted(name):
            mid = len(data) // 2
            data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            first, _, last = rng[6:].partition("-")
            start = int(first)
            end = int(last) + 1 if last else len(data)
            data, status = data[start:end], 206
        self.send_response(status)
        self.send_header("ETag", f'"{f.sha256}"')
        self.send_header("X-Repo-Commit", sha)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{len(f.data)}")
        self.end_headers()
        if not head:
            self._send_body(name, data)
        return status

    def _send_body(self, name: str, data: bytes) -> None:
        stall = self.hub._stall
        if stall is not None and stall[0] == name:
            self.wfile.write(data[: stall[1]])
            self.wfile.flush()
            self.hub.count_body(name, min(stall[1], len(data)))
            self.hub.stalled.set()
            self.hub._release.wait()
            self.wfile.write(data[stall[1] :])  # BrokenPipe when the client was killed meanwhile
            self.hub.count_body(name, len(data) - stall[1])
            return
        self.wfile.write(data)
        self.hub.count_body(name, len(data))

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> int:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        return status
