"""One view of the host for the steps that observe and decide (preflight, staging): each unit's state,
file and processes, and each engine's sleep state, read once; a write through the port forgets them.

Those steps ask the same few questions from several checks (is the target asleep under this very unit,
does its wake fit, what do the displaced engines leave, what is each model's fate): on an on-demand swap
every read is inside the held requests' wait, and over SSH each is a round trip. They never poll a unit
(a poll waits for a change a remembered answer would hide); the steps that do (stopping, freeing,
starting, the warm window) read the ports themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

from orchestrator.core.observed import UnitState
from orchestrator.deploy.context import StepContext
from orchestrator.ports import EngineControl, Systemd

T = TypeVar("T")


class _Memo:
    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], object] = {}

    def read(self, kind: str, key: str, read: Callable[[], T]) -> T:
        if (kind, key) not in self.seen:
            self.seen[kind, key] = read()
        return self.seen[kind, key]  # type: ignore[return-value]

    def forget(self) -> None:
        self.seen.clear()


class ReadOnceSystemd:
    """The Systemd port, its reads remembered until a write through it (any job, file or link change)."""

    def __init__(self, inner: Systemd, memo: _Memo) -> None:
        self._inner, self._memo = inner, memo
        self.host = inner.host

    def unit_state(self, unit: str) -> UnitState:
        return self._memo.read("state", unit, lambda: self._inner.unit_state(unit))

    def read_unit(self, unit: str) -> str | None:
        return self._memo.read("file", unit, lambda: self._inner.read_unit(unit))

    def cgroup_pids(self, unit: str) -> list[int]:
        return list(self._memo.read("pids", unit, lambda: tuple(self._inner.cgroup_pids(unit))))

    def journal_tail(self, unit: str, lines: int = 20) -> list[str]:
        return self._inner.journal_tail(unit, lines)

    def start(self, unit: str, *, timeout: float = 90.0) -> None:
        self._memo.forget()
        self._inner.start(unit, timeout=timeout)

    def stop(self, unit: str, *, timeout: float = 300.0) -> None:
        self._memo.forget()
        self._inner.stop(unit, timeout=timeout)

    def restart(self, unit: str, *, timeout: float = 90.0) -> None:
        self._memo.forget()
        self._inner.restart(unit, timeout=timeout)

    def reset_failed(self, unit: str) -> None:
        self._memo.forget()
        self._inner.reset_failed(unit)

    def kill_unit(self, unit: str, signal: int) -> None:
        self._memo.forget()
        self._inner.kill_unit(unit, signal)

    def install_unit(self, unit: str, content: str) -> None:
        self._memo.forget()
        self._inner.install_unit(unit, content)

    def remove_unit(self, unit: str) -> None:
        self._memo.forget()
        self._inner.remove_unit(unit)

    def daemon_reload(self) -> None:
        self._memo.forget()
        self._inner.daemon_reload()

    def enable(self, unit: str, *, reload: bool = True) -> bool:
        self._memo.forget()
        return self._inner.enable(unit, reload=reload)

    def disable(self, unit: str, *, reload: bool = True) -> bool:
        self._memo.forget()
        return self._inner.disable(unit, reload=reload)


class ReadOnceEngine:
    """An engine's sleep-mode control whose ``is_sleeping`` is remembered until a call that changes it."""

    def __init__(self, inner: EngineControl, memo: _Memo) -> None:
        self._inner, self._memo = inner, memo

    def is_sleeping(self, base_url: str) -> bool:
        return self._memo.read("sleeping", base_url, lambda: self._inner.is_sleeping(base_url))

    def sleep(self, base_url: str, level: int, mode: str = "wait") -> None:
        self._memo.forget()
        self._inner.sleep(base_url, level, mode)

    def wake(self, base_url: str, tags: Sequence[str] = ()) -> None:
        self._memo.forget()
        self._inner.wake(base_url, tags)

    def reload_weights(self, base_url: str) -> None:
        self._memo.forget()
        self._inner.reload_weights(base_url)

    def reset_prefix_cache(self, base_url: str) -> None:
        self._inner.reset_prefix_cache(base_url)

    def complete(self, base_url: str, model: str, timeout: float) -> str:
        return self._inner.complete(base_url, model, timeout)


def read_once(ctx: StepContext) -> StepContext:
    """``ctx`` whose systemd and engine controls remember what they read (one memo: a unit job forgets
    the engines' answers too); everything else, the run's shared state included, is ``ctx``'s own."""
    memo = _Memo()
    ports = dataclasses.replace(
        ctx.ports,
        systemd=ReadOnceSystemd(ctx.ports.systemd, memo),
        engine_controls={name: ReadOnceEngine(c, memo) for name, c in ctx.ports.engine_controls.items()},
    )
    return dataclasses.replace(ctx, ports=ports)
