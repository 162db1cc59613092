"""Run the local adapters INSIDE a test host and drive them from the test process.

The D-Bus adapter talks to the system bus of the machine it runs on, so to test it against a
host's real systemd it must run in that host. ``python -m tests.hosts.inside`` (started over ssh
by InsideAdapters) builds ``orchestrator.adapters.connect("local")`` in the host and serves its
Shell and Systemd as JSON lines on stdin/stdout; InsideAdapters returns proxies with the same
methods, re-raising the adapters' own error types. Every call is a real call in the host.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import subprocess
import sys
from typing import Any

from tests.hosts.machine import Host, HostError


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"__bytes__": base64.b64encode(value).decode()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        cls = type(value)
        return {
            "__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
            "fields": {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict) and "__bytes__" in value:
        return base64.b64decode(value["__bytes__"])
    if isinstance(value, dict) and "__dataclass__" in value:
        return _resolve(value["__dataclass__"])(**{k: _decode(v) for k, v in value["fields"].items()})
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _resolve(name: str) -> Any:
    module, _, qualname = name.partition(":")
    return getattr(importlib.import_module(module), qualname)


def _error_payload(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    return {
        "type": f"{cls.__module__}:{cls.__qualname__}",
        "message": getattr(exc, "message", str(exc)),
        "attrs": {k: v for k, v in vars(exc).items() if isinstance(v, str | int | type(None))},
    }


def _rebuild_error(payload: dict[str, Any]) -> BaseException:
    cls = _resolve(payload["type"])
    exc: BaseException = cls.__new__(cls)
    BaseException.__init__(exc, payload["message"])
    for key, value in payload["attrs"].items():
        setattr(exc, key, value)
    return exc


def serve() -> None:
    """The in-host side: one request per line, one answer per line."""
    from orchestrator.adapters import connect
    from orchestrator.errors import OrchestratorError

    shell, systemd = connect("local", host=sys.argv[1] if len(sys.argv) > 1 else "localhost")
    targets = {"shell": shell, "systemd": systemd}
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers may reach the pipe
    for line in sys.stdin:
        req = json.loads(line)
        try:
            method = getattr(targets[req["target"]], req["method"])
            result = method(*_decode(req["args"]), **{k: _decode(v) for k, v in req["kwargs"].items()})
            answer: dict[str, Any] = {"result": _encode(result)}
        except OrchestratorError as exc:
            answer = {"error": _error_payload(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()


class _Proxy:
    def __init__(self, owner: InsideAdapters, target: str, host: str) -> None:
        self._owner = owner
        self._target = target
        self.host = host

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self._owner.call(self._target, method, args, kwargs)


class InsideAdapters:
    """The host's own LocalShell and DbusSystemd, driven from the test process over ssh."""

    def __init__(self, host: Host) -> None:
        self._proc = subprocess.Popen(
            [*host.ssh_argv(shared=True), "--", host.python_command("-m", "tests.hosts.inside", host.name)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.shell: Any = _Proxy(self, "shell", host.name)
        self.systemd: Any = _Proxy(self, "systemd", host.name)
        self._host = host

    def call(self, target: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        req = {
            "target": target,
            "method": method,
            "args": _encode(list(args)),
            "kwargs": {k: _encode(v) for k, v in kwargs.items()},
        }
        self._proc.stdin.write(json.dumps(req) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise HostError(
                f"{self._host.name}: in-host adapter process exited ({self._proc.poll()}) during {target}.{method}"
            )
        answer = json.loads(line)
        if "error" in answer:
            raise _rebuild_error(answer["error"])
        return _decode(answer["result"])

    def alive(self) -> bool:
        return self._proc.poll() is None

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


if __name__ == "__main__":
    serve()
