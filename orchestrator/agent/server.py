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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from orchestrator.agent.peers import operator
from orchestrator.agent.protocol import OPS, encode, error_reply, peer_credentials
from orchestrator.deploy.operations import Operations
from orchestrator.errors import AgentError, Busy, OrchestratorError, UsageError

log = structlog.get_logger()

_DONE = object()


class Job:
    """One operation running on one host, with the listeners of its progress."""

    def __init__(self, host: str, op: str, args: dict[str, Any]) -> None:
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

    def busy(self, host: str) -> Job | None:
        with self.lock:
            return self.running.get(host)

    def submit(self, host: str, op: str, args: dict[str, Any], run: Callable[[Job], dict[str, Any]]) -> Job:
        with self.lock:
            current = self.running.get(host)
            if current is not None:
                raise Busy(f"host {host} is busy with {current.op} {_describe(current.args)} "
                           f"({self.ops._holder(host)}); try again when it ends", host=host)
            job = Job(host, op, args)
            self.running[host] = job
        thread = threading.Thread(target=self._run, args=(job, run), name=f"{op}-{host}", daemon=True)
        self.threads.append(thread)
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
            with self.lock:
                self.running.pop(job.host, None)
            job.done.set()
            job.publish(_DONE)
            self.on_finish(job)

    def join(self, timeout: float) -> None:
        for t in list(self.threads):
            t.join(timeout)


def _describe(args: dict[str, Any]) -> str:
    return " ".join(f"{v}" for v in args.values() if v not in (None, False, {}))


class _Handler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        agent = self.server.agent
        pid, uid, gid = peer_credentials(self.request)
        line = self.rfile.readline()  # read first, so a refused client gets the answer, not a broken pipe
        if not agent.authorized(uid, gid):
            self._send(error_reply(AgentError(f"uid {uid} may not use the agent: only root and members of "
                                              f"group {agent.group!r} may")))
            log.warning("client_refused", uid=uid, gid=gid)
            return
        try:
            request = _parse(line)
            reply_stream = agent.dispatch(request["op"], request.get("args") or {}, operator=operator(pid, uid))
            for item in reply_stream:
                self._send(item)
        except OrchestratorError as exc:
            self._send(error_reply(exc))
        except (BrokenPipeError, ConnectionResetError):
            log.info("client_detached")

    def _send(self, obj: dict[str, Any]) -> None:
        self.wfile.write(encode(obj))
        self.wfile.flush()


def _parse(line: bytes) -> dict[str, Any]:
    import json

    try:
        request = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"bad request {line[:100]!r}: not JSON") from exc
    if not isinstance(request, dict) or request.get("op") not in OPS:
        raise UsageError(f"bad request {line[:100]!r}: op must be one of {', '.join(sorted(OPS))}")
    return request


class ControlServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, path: str, agent: Any) -> None:
        self.agent = agent
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        if os.path.exists(path):
            _refuse_if_live(path)
            os.unlink(path)
        super().__init__(path, _Handler)
        os.chmod(path, 0o660)
        try:
            os.chown(path, -1, grp.getgrnam(agent.group).gr_gid)
        except KeyError:
            log.warning("socket_group_missing", group=agent.group, socket=path)


def _refuse_if_live(path: str) -> None:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return  # a stale socket from a crashed agent
    finally:
        probe.close()
    raise AgentError(f"another agent already listens on {path}")


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
