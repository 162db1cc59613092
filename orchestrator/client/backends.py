"""How the CLI reaches the operations: through the agent's socket when one runs, else in-process.

Both backends offer the same methods, so commands do not care which one they got.
"""

from __future__ import annotations

import json
import os
import socket
from contextlib import ExitStack
from typing import Any, Protocol

from orchestrator.agent.protocol import encode, raise_error
from orchestrator.core.catalog import Catalog
from orchestrator.errors import AgentError, Detached, OrchestratorError
from orchestrator.ports import ProgressCallback


class Backend(Protocol):
    def switch(self, model: str, *, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]: ...

    def rollback(self, host: str | None, to_revision: int | None, *,
                 progress: ProgressCallback | None = None) -> dict[str, Any]: ...

    def recover(self, host: str | None, *, progress: ProgressCallback | None = None) -> list[dict[str, Any]]: ...

    def stage(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]: ...

    def status(self, host: str | None) -> dict[str, Any]: ...

    def history(self, host: str | None, limit: int) -> list[dict[str, Any]]: ...

    def follow(self, host: str | None, *, progress: ProgressCallback | None = None) -> None: ...

    def schedules(self) -> list[dict[str, Any]]: ...


class AgentClient:
    """Talks to a running agent over its Unix socket (JSON lines)."""

    follow_hint = ""  # the global options a re-attaching command needs (a remote client's --host)

    def __init__(self, path: str) -> None:
        self.path = path

    def _open(self) -> Any:
        """A connected socket-like stream to the agent (sendall, makefile, close)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except PermissionError as exc:
            raise AgentError(f"agent socket {self.path}: permission denied (join its group, or run as root)") from exc
        except OSError as exc:
            raise AgentError(f"agent socket {self.path}: {exc.strerror or exc}") from exc
        return sock

    def _closed_early(self, op: str, stream: Any) -> OrchestratorError:
        return AgentError(f"agent at {self.path} closed the connection before answering {op}")

    def _call(self, op: str, args: dict[str, Any], progress: ProgressCallback | None = None) -> Any:
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
        finally:
            sock.close()

    def switch(self, model: str, *, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self._call("switch", {"model": model, "no_rollback": no_rollback, "force": force}, progress))

    def rollback(self, host: str | None, to_revision: int | None, *,
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self._call("rollback", {"host": host, "to_revision": to_revision}, progress))

    def recover(self, host: str | None, *, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        return list(self._call("recover", {"host": host}, progress)["recovered"])

    def stage(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        return dict(self._call("stage", {"model": model}, progress))

    def status(self, host: str | None) -> dict[str, Any]:
        return dict(self._call("status", {"host": host}))

    def history(self, host: str | None, limit: int) -> list[dict[str, Any]]:
        return list(self._call("history", {"host": host, "limit": limit}))

    def follow(self, host: str | None, *, progress: ProgressCallback | None = None) -> None:
        self._call("follow", {"host": host}, progress)

    def schedules(self) -> list[dict[str, Any]]:
        return list(self._call("schedules", {}))

    def config_show(self) -> dict[str, Any]:
        return dict(self._call("config_show", {}))

    def config_push(self, text: str, name: str) -> dict[str, Any]:
        return dict(self._call("config_push", {"text": text, "name": name}))


class LocalBackend:
    """Runs operations in this process (no agent running, or --local)."""

    def __init__(self, catalog: Catalog, *, ignore_agent: bool = False) -> None:
        from orchestrator.wiring import operations

        self.catalog = catalog
        self.ops = operations(catalog)
        self.ignore_agent = ignore_agent

    def _boxes(self, hosts: list[str]) -> ExitStack:
        """Agentless: the lock on each box reached over SSH, held for the whole operation."""
        from orchestrator.deploy.box_lock import box_lock

        stack = ExitStack()
        try:
            for name in hosts:
                stack.enter_context(box_lock(self.catalog.hosts[name], ignore_agent=self.ignore_agent))
        except BaseException:
            stack.close()
            raise
        return stack

    def _model_box(self, model: str) -> list[str]:
        return [self.ops._host_of(model)]

    def switch(self, model: str, *, no_rollback: bool = False, force: bool = False,
               progress: ProgressCallback | None = None) -> dict[str, Any]:
        with self._boxes(self._model_box(model)):
            return self.ops.switch(model, no_rollback=no_rollback, force=force, progress=progress)

    def rollback(self, host: str | None, to_revision: int | None, *,
                 progress: ProgressCallback | None = None) -> dict[str, Any]:
        with self._boxes([host or self.ops._only_host()]):
            return self.ops.rollback(host, to_revision, progress=progress)

    def recover(self, host: str | None, *, progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
        with self._boxes([host] if host else list(self.catalog.hosts)):
            return self.ops.recover(host, progress=progress)

    def stage(self, model: str, *, progress: ProgressCallback | None = None) -> dict[str, Any]:
        with self._boxes(self._model_box(model)):
            return self.ops.stage(model, progress=progress)

    def status(self, host: str | None) -> dict[str, Any]:
        from orchestrator.agent.daemon import schedule_rows

        return {**self.ops.status(host), "schedules": schedule_rows(self.catalog, self.ops)}

    def history(self, host: str | None, limit: int) -> list[dict[str, Any]]:
        return self.ops.history(host, limit)

    def follow(self, host: str | None, *, progress: ProgressCallback | None = None) -> None:
        return None  # nothing runs in the background without an agent

    def schedules(self) -> list[dict[str, Any]]:
        from orchestrator.agent.daemon import schedule_rows

        return schedule_rows(self.catalog, self.ops)


def backend_for(catalog: Catalog, *, local: bool = False, ignore_agent: bool = False) -> Backend:
    """The agent when its socket answers (unless --local), else this process."""
    from orchestrator.agent.daemon import socket_path

    path = socket_path(catalog)
    if not local and os.path.exists(path):
        client = AgentClient(path)
        try:
            client._call("ping", {})
            return client
        except AgentError as exc:
            if "permission denied" in str(exc) or "may not use the agent" in str(exc):
                raise
    return LocalBackend(catalog, ignore_agent=ignore_agent)
