"""How the CLI reaches the operations: through the agent's socket when one runs, else in-process.

Both backends run the operations of one table (``contract.ops``), so commands do not care which
one they got, and the arguments are checked the same way on both paths: once, where they are parsed
(the agent's socket, or here for the in-process backend).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from orchestrator.contract.operation import Operation
from orchestrator.contract.ops import OPERATIONS, PING
from orchestrator.contract.sides import Caller
from orchestrator.contract.wire import ReplyReader, request, socket_path
from orchestrator.errors import AgentError, Detached, Interrupted, OrchestratorError

if TYPE_CHECKING:
    from orchestrator.core.catalog import Catalog
    from orchestrator.deploy.operations import Operations
    from orchestrator.ports import ProgressCallback

R = TypeVar("R")


class Stream(Protocol):
    """A connected byte stream to an agent: a Unix socket, or a relay channel on an SSH connection
    (both have a ``fileno`` that select understands)."""

    def sendall(self, data: bytes) -> Any: ...

    def recv(self, n: int) -> bytes: ...

    def fileno(self) -> int: ...

    def close(self) -> Any: ...


class Backend:
    """Runs the table's operations; subclasses say how. ``call`` returns the operation's declared result."""

    def call(self, op: Operation[Any, R], args: dict[str, Any], progress: ProgressCallback | None = None) -> R:
        raise NotImplementedError


class AgentClient(Backend):
    """Talks to a running agent over its Unix socket (JSON lines); a remote client (client/remote.py)
    opens the same stream through an SSH relay instead. ``send`` and ``ended`` are what a caller
    multiplexing many agents (rollout/fanout.py) needs; ``call`` is one request read to its end."""

    follow_hint = ""  # the global options a re-attaching command needs (a remote client's --host)

    def __init__(self, path: str) -> None:
        self.path = path

    def open_stream(self) -> Stream:
        """A connected stream to the agent."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except PermissionError as exc:
            sock.close()
            raise AgentError(f"agent socket {self.path}: permission denied (join its group, or run as root)") from exc
        except OSError as exc:
            sock.close()
            raise AgentError(f"agent socket {self.path}: {exc.strerror or exc}") from exc
        return sock

    def send(self, op: str, args: dict[str, Any]) -> Stream:
        """A stream with the request sent on it; its answer follows (read it with a ReplyReader)."""
        stream = self.open_stream()
        try:
            stream.sendall(request(op, args))
        except OSError as exc:
            stream.close()
            raise AgentError(f"agent socket {self.path}: {op}: {exc.strerror or exc}") from exc
        except BaseException:  # anything else (an argument JSON cannot encode, Ctrl-C): close, re-raised as it was
            stream.close()
            raise
        return stream

    def ended(self, op: str, stream: Stream) -> OrchestratorError:
        """The error for a stream that ended before the answer to ``op`` came."""
        return AgentError(self.went_away(op))

    def went_away(self, op: str) -> str:
        """The agent closed the stream without an answer: it stopped or died. Its jobs are recorded
        before they run, so a restarted agent resumes or rolls back the one that was running."""
        text = f"agent at {self.path} closed the connection before answering {op} (it stopped or died)"
        spec = OPERATIONS.get(op)
        if spec is None or spec.job is None:  # a query: nothing was running for it
            return text
        return (
            f"{text}; the agent resumes the {op} when it starts again (systemd restarts it), or rolls it "
            f"back: follow it with `orchestrator {self.follow_hint}status --follow`"
        )

    def call(self, op: Operation[Any, R], args: dict[str, Any], progress: ProgressCallback | None = None) -> R:
        return op.reply(self.answer(op.name, args, progress), f"agent at {self.path}")

    def answer(self, op: str, args: dict[str, Any], progress: ProgressCallback | None = None) -> Any:
        """The result of one request (its events to ``progress``), or the error the agent answered."""
        stream = self.send(op, args)
        reader = ReplyReader()
        try:
            while reader.reply is None:
                data = stream.recv(65536)
                if not data:
                    raise self.ended(op, stream)
                for event in reader.feed(data):
                    if progress is not None:
                        progress(event.name, event.fields)
            return reader.reply.value()
        except KeyboardInterrupt:
            raise Detached(
                f"detached from {op}: the agent carries on (follow it with `orchestrator "
                f"{self.follow_hint}status --follow`)"
            ) from None
        except OSError as exc:
            raise AgentError(f"agent socket {self.path}: {op}: {exc.strerror or exc}") from exc
        finally:
            stream.close()


PARKS_ON_CTRL_C = frozenset({"switch", "rollback"})


class LocalBackend(Backend):
    """Runs operations in this process (no agent running, or --local)."""

    def __init__(self, catalog: Catalog, *, ignore_agent: bool = False, ops: Operations | None = None) -> None:
        from orchestrator.wiring import operations

        self.catalog = catalog
        self.ops = ops or operations(catalog)  # ops: given by a test, over fake ports
        # A query's: its stores open read-only, so status or history makes no state dir (nor a database).
        self.reader = ops or operations(catalog, reading=True)
        self.ignore_agent = ignore_agent

    def call(self, op: Operation[Any, R], args: dict[str, Any], progress: ProgressCallback | None = None) -> R:
        parsed = op.parse(self.catalog, args)
        # An operation that changes a box holds that box's own lock (agentless use over SSH).
        with self._boxes(op.locks(self.catalog, parsed)), self._parking_on_sigint(op.name) as asked:
            result = op.in_process(self.reader if op.reads_only else self.ops, parsed, Caller(progress=progress))
        if asked:
            stopped = Interrupted(
                f"interrupted (Ctrl-C): {op.name} stopped after its current step{_where(result)}; "
                "nothing runs it now: `orchestrator recover` finishes it (so does the next switch, "
                "or the agent when it starts), `orchestrator status` shows it"
            )
            stopped.partial = result
            raise stopped
        return result

    @contextmanager
    def _parking_on_sigint(self, op: str) -> Iterator[list[bool]]:
        """Ctrl-C in this process does what SIGTERM does to the agent: the running step finishes (a wait
        ends at its next poll) and the deployment parks, recorded; a second Ctrl-C quits at once. Only
        for one deployment (switch, rollback): a tune or a recovery would start the next one."""
        asked: list[bool] = []
        if op not in PARKS_ON_CTRL_C or threading.current_thread() is not threading.main_thread():
            yield asked
            return

        def park(signum: int, frame: object) -> None:
            if asked:
                raise KeyboardInterrupt
            asked.append(True)
            self.ops.park_all()
            os.write(
                2,
                b"\nCtrl-C: the current step finishes, then the operation stops, recorded "
                b"(Ctrl-C again to quit at once)\n",
            )

        previous = signal.signal(signal.SIGINT, park)
        try:
            yield asked
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def _boxes(self, hosts: list[str]) -> Iterator[None]:
        """Agentless: the lock on each box reached over SSH, held for the whole operation (a lock
        that cannot be taken releases the ones already held, as the stack unwinds)."""
        from orchestrator.client.box_lock import box_lock

        with ExitStack() as stack:
            for name in hosts:
                stack.enter_context(box_lock(self.catalog.hosts[name], ignore_agent=self.ignore_agent))
            yield


def _where(result: object) -> str:
    """Which deployment an interrupted operation left, and its phase, when its result says."""
    if isinstance(result, dict) and "revision" in result:
        return (
            f": revision {result['revision']} ({result.get('model', '?')}) in phase "
            f"{result.get('phase') or result.get('outcome', '?')} on {result.get('host', '?')}"
        )
    return ""


def agent_at(path: str) -> AgentClient | None:
    """The agent at ``path`` when it answers a ping; None when none runs there. An agent that is there
    but refuses this user is an error (acting in-process instead would bypass it)."""
    if not os.path.exists(path):
        return None
    client = AgentClient(path)
    try:
        client.call(PING, {})
        return client
    except AgentError as exc:
        if "permission denied" in str(exc) or "may not use the agent" in str(exc):
            raise
    return None


def backend_for(catalog: Catalog, *, local: bool = False, ignore_agent: bool = False) -> Backend:
    """The agent when its socket answers (unless --local), else this process."""
    client = None if local else agent_at(socket_path(catalog.state_dir))
    return client or LocalBackend(catalog, ignore_agent=ignore_agent)
