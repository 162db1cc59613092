"""The two sides of a request besides the operation itself: who asks (``Caller``) and what only a running
agent answers (``AgentSide``, with its fleet controller and its tune runs): declared here, implemented in
agent/ (daemon.py, controller.py, tune_jobs.py), so that the contract does not import the agent above it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from orchestrator.contract.args import RolloutStartArgs, TuneArgs, TuneHostArgs
    from orchestrator.deploy.operations import Operations
    from orchestrator.ports import ProgressCallback


@dataclass(frozen=True)
class Caller:
    """Who asks and who listens: ``trigger`` is recorded in the audit trail (None: this CLI's user);
    ``uid`` is the agent's peer (None: unknown, so never root)."""

    progress: ProgressCallback | None = None
    trigger: str | None = None
    uid: int | None = None
    next_runs: dict[str, float] | None = None  # the agent's schedule clock, for `schedules`


class AgentSide(Protocol):
    """What only a running agent knows: its process, its jobs, the file it was started from."""

    @property
    def ops(self) -> Operations: ...

    def info(self) -> dict[str, Any]: ...

    def annotate(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]: ...

    def config_show(self) -> dict[str, Any]: ...

    def config_push(self, text: str, name: str | None, caller: Caller) -> dict[str, Any]: ...

    def root_only_changes(self, text: str, name: str | None) -> list[str]: ...

    def follow(self, host: str | None) -> Iterator[dict[str, Any]]: ...

    @property
    def controller(self) -> RolloutController: ...

    @property
    def tuner(self) -> TuneController: ...


class RolloutController(Protocol):
    """What the rollout operations ask of the controller's agent (agent/controller.py implements it):
    declared here so that the contract does not import the agent above it."""

    def start(self, args: RolloutStartArgs, started_by: str | None) -> dict[str, Any]: ...

    def follow(self, rid: int | None) -> Iterator[dict[str, Any]]: ...

    def summary(self, rid: int | None) -> dict[str, Any]: ...

    def resume(self, rid: int | None) -> dict[str, Any]: ...

    def abort(self, rid: int | None, rollback_all: bool) -> dict[str, Any]: ...


class TuneController(Protocol):
    """What the tune operations ask of an agent (agent/tune_jobs.py): each runs (or watches) a job that
    holds the model's host, streamed until it ends; a client that goes away only detaches."""

    def plan(self, args: TuneArgs) -> Iterator[dict[str, Any]]: ...

    def start(self, args: TuneArgs) -> Iterator[dict[str, Any]]: ...

    def resume(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]: ...

    def abort(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]: ...

    def follow(self, args: TuneHostArgs) -> Iterator[dict[str, Any]]: ...

    def status(self, args: TuneHostArgs) -> dict[str, Any]: ...
