"""The agent: owns every operation on its hosts, so a dropped SSH session never half-switches a box.

Operations run in their own threads, one at a time per host; a client connection only watches
one. When the client goes away the operation goes on, and ``status --follow`` re-attaches.
"""

from __future__ import annotations

import grp
import os
import pwd
import queue
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator import logs, unix_sockets
from orchestrator.agent.peers import operator
from orchestrator.contract.ops import OPERATIONS
from orchestrator.contract.wire import MAX_REQUEST, encode, error_reply, peer_credentials
from orchestrator.core.documents import DocumentError, clip, json_document
from orchestrator.deploy.operations import Operations
from orchestrator.errors import AgentError, Busy, OrchestratorError, UsageError
from orchestrator.unix_sockets import BoundedServer

log = logs.get_logger()

_DONE = object()


class Job:
    """One operation running on one host, with the listeners of its progress. ``op`` is the name of an
    entry of the operation table (contract/ops.py), whoever starts it (a client, a schedule, the broker,
    the controller): the table is the one list of what the agent runs, so any other name is refused."""

    END = _DONE  # the last item of every listener's queue (the dashboard, a layer below, reads it from the job)

    def __init__(self, host: str, op: str, args: dict[str, Any]) -> None:
        if op not in OPERATIONS:
            raise AgentError(
                f"job {op!r} on host {host}: not an operation of the table (contract/ops.py); "
                f"declare it there (known: {', '.join(sorted(OPERATIONS))})"
            )
        self.host, self.op, self.args = host, op, args
        self.listeners: list[queue.Queue[Any]] = []
        self.lock = threading.Lock()
        self.result: dict[str, Any] | None = None
        self.done = threading.Event()

    def publish(self, item: Any) -> None:
        with self.lock:
            for q in self.listeners:
                q.put(item)

    def listen(self) -> queue.Queue[Any]:
        q: queue.Queue[Any] = queue.Queue()
        with self.lock:
            if self.done.is_set():
                q.put(_DONE)
            self.listeners.append(q)
        return q

    def unlisten(self, q: queue.Queue[Any]) -> None:
        with self.lock:
            if q in self.listeners:
                self.listeners.remove(q)


class Jobs:
    """The running operation of each host; a second one on a busy host is refused, naming the first."""

    def __init__(self, ops: Operations, on_finish: Callable[[Job], None]) -> None:
        self.ops = ops
        self.on_finish = on_finish
        self.running: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        # Told of each job as it starts (before its first event) and when it has ended: the dashboard.
        self.observers: list[Callable[[str, Job], None]] = []

    def busy(self, host: str) -> Job | None:
        with self.lock:
            return self.running.get(host)

    def submit(self, host: str, op: str, args: dict[str, Any], run: Callable[[Job], dict[str, Any]]) -> Job:
        with self.lock:
            current = self.running.get(host)
            if current is not None:
                raise Busy(
                    f"host {host} is busy with {current.op} {_describe(current.args)} "
                    f"({self.ops.holder(host)}); try again when it ends",
                    host=host,
                )
            job = Job(host, op, args)
            self.running[host] = job
        thread = threading.Thread(target=self._run, args=(job, run), name=f"{op}-{host}", daemon=True)
        self.threads.append(thread)
        self._notify("started", job)
        thread.start()
        return job

    def _run(self, job: Job, run: Callable[[Job], dict[str, Any]]) -> None:
        try:
            job.result = {"result": run(job)}
        except OrchestratorError as exc:
            job.result = error_reply(exc)
        except Exception as exc:  # the agent's top loop: one bad operation must not kill the daemon
            log.exception("operation_crashed", host=job.host, op=job.op)
            job.result = error_reply(AgentError(f"{job.op} on host {job.host} crashed: {exc!r}"))
        finally:
            # What the job's end updates (metrics: the residency gauge) before anyone sees it done: a
            # caller that waits for ``done`` (or the broker's next swap on the host) reads it current.
            try:
                self.on_finish(job)
            except Exception:  # logged: the job's end (done, its waiters, the observers) must still come
                log.exception("job_finish_failed", host=job.host, op=job.op)
            with self.lock:
                self.running.pop(job.host, None)
            job.done.set()
            job.publish(_DONE)
            self._notify("finished", job)

    def _notify(self, what: str, job: Job) -> None:
        for observer in list(self.observers):
            try:
                observer(what, job)
            except Exception:  # an observer (the dashboard) must never fail an operation
                log.exception("job_observer_failed", host=job.host, op=job.op)

    def join(self, timeout: float) -> None:
        for t in list(self.threads):
            t.join(timeout)


def _describe(args: dict[str, Any]) -> str:
    return " ".join(f"{v}" for v in args.values() if v not in (None, False, {}))


# Bounds on what one client can take from the agent: request size (contract.wire.MAX_REQUEST), time to
# send it (and to take each reply line), connections at once, and how long a refused client is
# listened to. Beyond them a client gets a usage or agent error.
IO_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
DRAIN_S = 1.0


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer
    timeout = IO_TIMEOUT_S  # applied to the socket before handle(): a silent client is dropped

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.io_timeout_s)

    def handle(self) -> None:
        agent = self.server.agent
        try:
            pid, uid, gid = peer_credentials(self.request)
            if not agent.authorized(uid, gid):  # before reading a single byte of the request
                log.warning("client_refused", uid=uid, gid=gid)
                self._refuse(
                    AgentError(f"uid {uid} may not use the agent: only root and members of group {agent.group!r} may")
                )
                return
            try:
                request = _parse(self._read_request())
                for item in agent.dispatch(request.get("op"), request.get("args"), operator(pid, uid), uid=uid):
                    self._send(item)
            except OrchestratorError as exc:
                log.info("request_refused", uid=uid, error=str(exc))
                self._refuse(exc)  # the rest of an oversized request is read and dropped, not reset
        except OSError as exc:  # gone, reset, or too slow to send or to read: the operation goes on
            log.info("client_detached", error=type(exc).__name__)
        except Exception as exc:  # the agent's top loop: one request must not take the socket down
            log.exception("request_crashed")
            try:
                self._send(error_reply(AgentError(f"the agent failed on this request: {type(exc).__name__}")))
            except OSError:
                pass

    def _read_request(self) -> bytes:
        """Up to the first newline, within MAX_REQUEST bytes and IO_TIMEOUT_S seconds in all (a
        per-read timeout alone would let a client drip one byte at a time for days)."""
        limit_s = self.server.io_timeout_s
        deadline = time.monotonic() + limit_s
        buf = bytearray()
        while b"\n" not in buf and len(buf) <= MAX_REQUEST:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UsageError(f"bad request: not sent within {limit_s:g} s")
            self.request.settimeout(remaining)
            try:
                chunk = self.request.recv(MAX_REQUEST + 1 - len(buf))
            except TimeoutError:
                raise UsageError(f"bad request: not sent within {limit_s:g} s") from None
            if not chunk:
                break
            buf += chunk
        self.request.settimeout(limit_s)
        end = buf.find(b"\n")
        return bytes(buf if end < 0 else buf[: end + 1])

    def _send(self, obj: dict[str, Any]) -> None:
        self.wfile.write(encode(obj))
        self.wfile.flush()

    def _refuse(self, exc: OrchestratorError) -> None:
        """Answer, then read (and drop) what the client sends for a moment, so it reads our answer
        instead of a reset from closing on its unread request."""
        self._send(error_reply(exc))
        _drain(self.request)

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass  # the client went away: flushing the rest of the replies cannot work


def _drain(sock: socket.socket) -> None:
    """After our answer: read and drop what the client sends for DRAIN_S in all, so it reads the
    answer instead of a reset from our closing on its unread request. The deadline is overall: a
    client dripping a byte at a time must not hold the connection (and its slot) for ever."""
    deadline = time.monotonic() + DRAIN_S
    try:
        sock.shutdown(socket.SHUT_WR)
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(65536):
                break
    except OSError:
        pass


def _parse(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_REQUEST:
        raise UsageError(f"bad request: longer than {MAX_REQUEST} bytes ({MAX_REQUEST // 1024} KiB)")
    if not line.endswith(b"\n"):
        raise UsageError(f"bad request {line[:100]!r}: one JSON object and a newline expected")
    try:
        request = json_document(line, "request")  # duplicate keys refused: the last would silently win
    except DocumentError as exc:
        reason = exc.reason if "duplicate key" in exc.reason or "nested" in exc.reason else "not JSON"
        raise UsageError(f"bad request {line[:100]!r}: {reason}") from None
    if not isinstance(request, dict):
        raise UsageError(f"bad request {line[:100]!r}: a JSON object with op and args expected")
    extra = sorted(set(request) - {"op", "args"})
    if extra:
        raise UsageError(f"bad request: unknown key {clip(extra[0], 50)} (a request has op and args)")
    return request


class ControlServer(BoundedServer):
    allow_reuse_address = True

    def __init__(
        self, path: str, agent: Any, max_connections: int = MAX_CONNECTIONS, io_timeout_s: float = IO_TIMEOUT_S
    ) -> None:
        self.agent = agent
        self.io_timeout_s = io_timeout_s
        self.slots = threading.BoundedSemaphore(max_connections)
        self.overflow = threading.BoundedSemaphore(max_connections)  # clients being told "too many"
        self.max_connections = max_connections
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        unix_sockets.clear_stale(path, "agent socket")
        super().__init__(path, _Handler)
        self.bound = unix_sockets.bound(path)
        os.chmod(path, 0o660)
        try:
            os.chown(path, -1, grp.getgrnam(agent.group).gr_gid)
        except KeyError:
            log.warning("socket_group_missing", group=agent.group, socket=path)

    def turn_away(self, request: socket.socket) -> None:
        log.warning("client_turned_away", connections=self.max_connections)
        if self.overflow.acquire(blocking=False):  # answer it, briefly, off the accepting thread
            threading.Thread(target=self._tell_too_many, args=(request,), daemon=True).start()
        else:
            self.shutdown_request(request)

    def _tell_too_many(self, request: socket.socket) -> None:
        try:
            request.settimeout(DRAIN_S)
            request.sendall(
                encode(
                    error_reply(AgentError(f"the agent already serves {self.max_connections} connections; try again"))
                )
            )
            _drain(request)
        except OSError:
            pass
        finally:
            self.shutdown_request(request)
            self.overflow.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("control_socket_error")  # one structured line, not socketserver's stderr dump


def authorized(uid: int, gid: int, group: str) -> bool:
    """root, the agent's own user, or a member of the socket group."""
    if uid in (0, os.getuid()):
        return True
    try:
        group_gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return False
    if gid == group_gid:
        return True
    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    return group_gid in os.getgrouplist(user.pw_name, user.pw_gid)
