"""The demand socket: where the front proxy asks the agent for a model it holds a request for.

Per held request the proxy connects and sends one line, ``{"model": NAME, "stream": BOOL}``. The
agent answers ``{"waiting": SECONDS, "queued": N}`` at least every second while the request waits,
then one final line and closes: ``{"ready": true}`` (route it now) or ``{"status": 429|404|503,
"message": ..., "retry_after_s": INT or null}``. The proxy closing its end means the client went
away: the request no longer waits. Only root, the agent's own user and HAProxy's may connect.

The socket is 0660 in HAProxy's group; a directory the agent creates for it (the default,
/run/orchestrator, always) is 0750 root and that group, so HAProxy's workers reach it after they
drop to their own user. The agent marks a directory it creates (``MARK``) and makes it again for a
later [proxy] group; an operator's own directory is never changed. `check_reachable` says what that
user lacks, before any request is held.
"""

from __future__ import annotations

import grp
import os
import pwd
import resource
import select
import socket
import socketserver
import stat
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from orchestrator import logs, unix_sockets
from orchestrator.agent.demand import Broker
from orchestrator.agent.server import _drain
from orchestrator.contract.wire import encode, peer_credentials
from orchestrator.core.catalog import DEFAULT_DEMAND_SOCKET
from orchestrator.core.documents import DocumentError, json_document
from orchestrator.core.socket_access import Account, Entry, missing_access, path_chain
from orchestrator.errors import ConfigError
from orchestrator.unix_sockets import BoundedServer

log = logs.get_logger()

MAX_LINE = 4096
READ_TIMEOUT_S = 5.0
TAKEN_WAIT_S = 2.0  # how long a ready answer's connection waits for the proxy to close its end
BEAT_S = 0.5  # the waiting lines' pace: twice the promised once a second, so one late line is no alarm
MAX_CONNECTIONS = 4096  # each held request is one connection; queue_limit bounds them per model
PROXY_USER = "haproxy"  # Debian's package account: HAProxy's `user` when it drops root
DEFAULT_DIR = DEFAULT_DEMAND_SOCKET.rsplit("/", 1)[0]  # the agent's own: made reachable at each start
# In a socket directory the agent created: it is the agent's, re-owned for each [proxy] group (a
# record that survives the agent's restart; /run's directories go with a reboot, and the mark with them).
MARK = ".made-by-orchestrator"


def allowed_uids(user: str = PROXY_USER) -> frozenset[int]:
    """root, this process's user and HAProxy's account (when the box has one)."""
    uids = {0, os.getuid()}
    try:
        uids.add(pwd.getpwnam(user).pw_uid)
    except KeyError:
        pass
    return frozenset(uids)


def check_reachable(path: str, user: str, group: str, *, planned: bool = False) -> None:
    """ConfigError (exit 2) naming the socket, the account and the permission it lacks when HAProxy's
    workers, running as ``user`` and ``group`` ([proxy] user, group), cannot connect to ``path``.
    ``planned``: before the agent opens it (a push): the socket, the default directory and those not
    there yet are taken as DemandServer makes them (0660 and 0750, root and ``group``)."""
    try:
        pw = pwd.getpwnam(user)
        gid = grp.getgrnam(group).gr_gid
    except KeyError as exc:
        raise ConfigError(
            f"HAProxy's account {exc.args[0]} ([proxy] user {user!r}, group {group!r}) does not exist "
            "on this box: create it, or unset [proxy] user",
            key="proxy.user",
        ) from exc
    who = Account(user, pw.pw_uid, frozenset({gid, *os.getgrouplist(user, pw.pw_gid)}))
    paths = path_chain(path)
    chain = [_entry(p, gid if planned else None, group, p == paths[-1]) for p in paths]
    missing = missing_access(chain, who)
    if missing is not None:
        raise ConfigError(
            f"HAProxy's user {user} (group {group}) cannot reach the demand socket {path}: it lacks "
            f"{missing}; a held request would get 503. Leave [proxy] demand_socket unset "
            f"(/run/orchestrator/demand.sock, made reachable for group {group}) or open that path to it",
            key="proxy.demand_socket",
        )


def made_here(path: str | Path) -> bool:
    """The agent created directory ``path`` for a socket: its mark is there, the mark and the directory
    owned by the agent's own user (no one else could have put it there)."""
    try:
        here, mark = os.lstat(path), os.lstat(os.path.join(path, MARK))
    except OSError:
        return False
    return stat.S_ISDIR(here.st_mode) and stat.S_ISREG(mark.st_mode) and here.st_uid == mark.st_uid == os.getuid()


def _entry(path: str, planned_gid: int | None, group: str, last: bool) -> Entry:
    if planned_gid is not None and (last or path == DEFAULT_DIR or not os.path.exists(path) or made_here(path)):
        mode = stat.S_IFSOCK | 0o660 if last else stat.S_IFDIR | 0o750
        return Entry(path, mode, 0, planned_gid, "root", group)
    st = os.stat(path)
    return Entry(path, st.st_mode, st.st_uid, st.st_gid, _name(pwd.getpwuid, st.st_uid), _name(grp.getgrgid, st.st_gid))


def _name(look: Any, ident: int) -> str:
    try:
        return str(look(ident)[0])
    except KeyError:
        return str(ident)


def _prepare_dir(path: Path, group: str) -> None:
    """The socket's directory: one the agent creates (marked so, then made again for each new
    ``group``), and always the default one, is 0750 in ``group`` (HAProxy's), 0700 where the box has no
    such group; an operator's existing one is left as is."""
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        if str(path) != DEFAULT_DIR and not made_here(path):
            return
    else:
        (path / MARK).write_text(
            "made by the orchestrator agent for its demand socket: it sets this directory's group to [proxy] group\n"
        )
    try:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
        os.chmod(path, 0o750)
    except (KeyError, PermissionError):
        os.chmod(path, 0o700)


class _Handler(socketserver.BaseRequestHandler):
    server: DemandServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            _, uid, _ = peer_credentials(sock)
            if uid not in self.server.uids:
                log.warning("demand_client_refused", uid=uid)
                self._send(
                    {
                        "status": 503,
                        "message": f"uid {uid} may not use the demand socket (root and HAProxy's user only)",
                        "retry_after_s": None,
                    }
                )
                _drain(sock)  # so the client reads the answer, not a reset from its unread line
                return
            request = self._read()
            if isinstance(request, str):
                self._send({"status": 503, "message": request, "retry_after_s": None})
                _drain(sock)
                return
            self._serve(sock, request)
        except OSError as exc:
            log.info("demand_client_gone", error=type(exc).__name__)

    def _read(self) -> dict[str, Any] | str:
        """The request line as a dict, or what is wrong with it."""
        sock: socket.socket = self.request
        sock.settimeout(READ_TIMEOUT_S)
        buf = b""
        try:
            while b"\n" not in buf and len(buf) <= MAX_LINE:
                chunk = sock.recv(MAX_LINE + 1 - len(buf))
                if not chunk:
                    break
                buf += chunk
        except TimeoutError:
            return f"bad demand request: no line within {READ_TIMEOUT_S:g} s"
        line = buf.split(b"\n", 1)[0]
        if b"\n" not in buf:
            return f"bad demand request {line[:80]!r}: one JSON line of at most {MAX_LINE} bytes expected"
        try:
            request = json_document(line, "demand request")
        except DocumentError as exc:
            return f"bad demand request {line[:80]!r}: {exc.reason}"
        if (
            not isinstance(request, dict)
            or not isinstance(request.get("model"), str)
            or not isinstance(request.get("stream", False), bool)
            or set(request) - {"model", "stream"}
        ):
            return f'bad demand request {line[:80]!r}: {{"model": NAME, "stream": BOOL}} expected'
        return request

    def _serve(self, sock: socket.socket, request: dict[str, Any]) -> None:
        broker = self.server.broker
        ticket = broker.open(request["model"], bool(request.get("stream", False)))
        try:
            poller = select.poll()  # not select(): held requests may take descriptors past FD_SETSIZE
            if ticket.answer is None:
                poller.register(sock.fileno(), select.POLLIN)
                poller.register(ticket.fileno(), select.POLLIN)
            while ticket.answer is None:
                ready = {fd for fd, _ in poller.poll(BEAT_S * 1000)}
                if sock.fileno() in ready and not _alive(sock):
                    broker.cancel(ticket)
                    return
                if ticket.answer is None:
                    waited = broker.clock.monotonic() - ticket.arrived
                    try:
                        self._send({"waiting": round(waited, 1), "queued": broker.position(ticket)})
                    except OSError:
                        broker.cancel(ticket)
                        return
            self._send(ticket.answer)
            if ticket.answer.get("ready") is True:
                sock.shutdown(socket.SHUT_WR)  # the last line: a reader until the end has it
                if _closed_within(sock, TAKEN_WAIT_S):
                    broker.taken(ticket)  # the hold ended: HAProxy sends the request on in the same pass
        finally:
            ticket.close()

    def _send(self, obj: dict[str, Any]) -> None:
        self.request.sendall(encode(obj))


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer closed its end within ``seconds`` (the hold's Lua closes as it reads its answer)."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLHUP)
    return bool(poller.poll(seconds * 1000)) and not _alive(sock)


def _alive(sock: socket.socket) -> bool:
    """The peer still holds its end (readable with data it should not send, or closed: gone)."""
    try:
        return bool(sock.recv(MAX_LINE, socket.MSG_DONTWAIT))
    except BlockingIOError:
        return True
    except OSError:
        return False


class DemandServer(BoundedServer):
    def __init__(
        self,
        path: str,
        broker: Broker,
        uids: Collection[int] | None = None,
        *,
        user: str = PROXY_USER,
        group: str = PROXY_USER,
    ) -> None:
        """``user``, ``group``: HAProxy's ([proxy] user and group; Debian's haproxy account by default)."""
        _room_for_connections()
        self.broker = broker
        self.uids = frozenset(uids) if uids is not None else allowed_uids(user)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        _prepare_dir(Path(path).parent, group)
        unix_sockets.clear_stale(path, "demand socket")
        super().__init__(path, _Handler)
        self.bound = unix_sockets.bound(path)
        os.chmod(path, 0o660)  # peer credentials decide; the mode keeps everyone else from connecting
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except (KeyError, PermissionError):
            os.chmod(path, 0o600)

    def turn_away(self, request: socket.socket) -> None:
        log.warning("demand_client_turned_away", connections=MAX_CONNECTIONS)
        try:
            request.sendall(
                encode(
                    {
                        "status": 429,
                        "message": f"the agent holds {MAX_CONNECTIONS} requests already",
                        "retry_after_s": 1,
                    }
                )
            )
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("demand_socket_error")


def _room_for_connections() -> None:
    """Each held request takes three descriptors (its connection, its wake-up pipe): raise the soft
    limit (1024 under systemd) to the hard one, up to what MAX_CONNECTIONS needs and a margin."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * MAX_CONNECTIONS + 1024
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
