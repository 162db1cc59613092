"""How the CLI reaches the operations: through the agent's socket when one runs, else in-process.

Both backends run the operations of one table (``client.table``), so commands do not care which
one they got, and the arguments are checked the same way on both paths.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from orchestrator.agent.protocol import encode, raise_error
from orchestrator.client.table import OPERATIONS, Call, lookup
from orchestrator.core.catalog import Catalog
from orchestrator.errors import AgentError, Detached, OrchestratorError
from orchestrator.ports import ProgressCallback


class Backend:
    """The typed face of the table's operations; subclasses say how ``call`` reaches them."""

    def call(self, op: str, args: dict[str, Any], progress: ProgressCallback | None = None) -> Any:
        raise NotImplementedError

    def switch(self, model: str, *, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self.call("switch", {"model": model, "no_rollback": no_rollback, "force": force}, progress))

    def rollback(self, host: str | None, to_revision: int | None, *,
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self.call("rollback", {"host": host, "to_revision": to_revision}, progress))

    def recover(self, host: str | None, *, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        return list(self.call("recover", {"host": host}, progress)["recovered"])

    def stop(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self.call("stop", {"model": model}, progress))

    def stage(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self.call("stage", {"model": model}, progress))

    def check_together(self, models: list[str]) -> str:
        """The host the models serve on together, or UsageError (the box's catalog decides)."""
        return str(self.call("check_together", {"models": models})["host"])

    def explain(self, model: str) -> dict[str, Any]:
        return dict(self.call("explain", {"model": model}))

    def status(self, host: str | None) -> dict[str, Any]:
        return dict(self.call("status", {"host": host}))

    def history(self, host: str | None, limit: int) -> list[dict[str, Any]]:
        return list(self.call("history", {"host": host, "limit": limit}))

    def follow(self, host: str | None, *, progress: ProgressCallback | None = None) -> None:
        self.call("follow", {"host": host}, progress)

    def schedules(self) -> list[dict[str, Any]]:
        return list(self.call("schedules", {}))

    def config_show(self) -> dict[str, Any]:
        return dict(self.call("config_show", {}))

    def config_push(self, text: str, name: str) -> dict[str, Any]:
        return dict(self.call("config_push", {"text": text, "name": name}))


class AgentClient(Backend):
    """Talks to a running agent over its Unix socket (JSON lines); a remote client (client/remote.py)
    opens the same stream through an SSH relay instead."""

    follow_hint = ""  # the global options a re-attaching command needs (a remote client's --host)

    def __init__(self, path: str) -> None:
        self.path = path

    def _open(self) -> Any:
        """A connected socket-like stream to the agent (sendall, makefile, close)."""
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

    def _closed_early(self, op: str, stream: Any) -> OrchestratorError:
        return AgentError(self.went_away(op))

    def went_away(self, op: str) -> str:
        """The agent closed the stream without an answer: it stopped or died. Its jobs are recorded
        before they run, so a restarted agent resumes or rolls back the one that was running."""
        text = f"agent at {self.path} closed the connection before answering {op} (it stopped or died)"
        spec = OPERATIONS.get(op)
        if spec is None or spec.host is None:  # a query: nothing was running for it
            return text
        return (f"{text}; the agent resumes the {op} when it starts again (systemd restarts it), or rolls it "
                f"back: follow it with `orchestrator {self.follow_hint}status --follow`")

    def call(self, op: str, args: dict[str, Any], progress: ProgressCallback | None = None) -> Any:
        sock = self._open()
        try:
            sock.sendall(encode({"op": op, "args": args}))
            with sock.makefile("rb") as stream:
                for line in stream:
                    msg = json.loads(line)
                    if "event" in msg:
                        if progress is not None:
                            progress(str(msg["event"]), dict(msg.get("fields") or {}))
                    elif "error" in msg:
                        raise_error(msg["error"])
                    else:
                        return msg.get("result")
            raise self._closed_early(op, sock)
        except KeyboardInterrupt:
            raise Detached(f"detached from {op}: the agent carries on (follow it with `orchestrator "
                           f"{self.follow_hint}status --follow`)") from None
        except OSError as exc:
            raise AgentError(f"agent socket {self.path}: {op}: {exc.strerror or exc}") from exc
        finally:
            sock.close()


class LocalBackend(Backend):
    """Runs operations in this process (no agent running, or --local)."""

    def __init__(self, catalog: Catalog, *, ignore_agent: bool = False) -> None:
        from orchestrator.wiring import operations

        self.catalog = catalog
        self.ops = operations(catalog)
        self.ignore_agent = ignore_agent

    def call(self, op: str, args: dict[str, Any], progress: ProgressCallback | None = None) -> Any:
        spec = lookup(op)
        parsed = spec.parse(self.catalog, args)
        if spec.host is None:
            return spec.run(self.ops, parsed, Call(progress=progress))
        # An operation that changes a box holds that box's own lock (agentless use over SSH).
        with self._boxes(list(self.catalog.hosts) if op == "recover" and parsed.host is None  # type: ignore[attr-defined]
                         else [spec.host(self.ops, parsed)]):
            return spec.run(self.ops, parsed, Call(progress=progress))

    @contextmanager
    def _boxes(self, hosts: list[str]) -> Iterator[None]:
        """Agentless: the lock on each box reached over SSH, held for the whole operation (a lock
        that cannot be taken releases the ones already held, as the stack unwinds)."""
        from orchestrator.deploy.box_lock import box_lock

        with ExitStack() as stack:
            for name in hosts:
                stack.enter_context(box_lock(self.catalog.hosts[name], ignore_agent=self.ignore_agent))
            yield


def backend_for(catalog: Catalog, *, local: bool = False, ignore_agent: bool = False) -> Backend:
    """The agent when its socket answers (unless --local), else this process."""
    from orchestrator.agent.daemon import socket_path

    path = socket_path(catalog)
    if not local and os.path.exists(path):
        client = AgentClient(path)
        try:
            client.call("ping", {})
            return client
        except AgentError as exc:
            if "permission denied" in str(exc) or "may not use the agent" in str(exc):
                raise
    return LocalBackend(catalog, ignore_agent=ignore_agent)
