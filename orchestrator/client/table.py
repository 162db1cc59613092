"""The one table of operations: name -> arguments (validated) and what runs them on ``Operations``.

The agent's socket protocol and the in-process backend are both built from it, so adding an
operation is one entry here. Every argument is checked before use: types and ranges by the
argument model (unknown keys refused), model and host names against the catalog. A bad request
is one UsageError naming the operation, the argument and the value.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import check_together
from orchestrator.deploy.operations import Operations
from orchestrator.errors import UsageError
from orchestrator.ports import ProgressCallback


class Args(BaseModel):
    """Arguments of one operation: strict JSON types, no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def check(self, catalog: Catalog) -> None:
        """Names must exist in the catalog (never used as paths before this)."""
        model = getattr(self, "model", None)
        if model is not None:
            catalog.model(model)
        host = getattr(self, "host", None)
        if host is not None:
            catalog.host(host)


class NoArgs(Args):
    pass


class ModelArgs(Args):
    model: str = Field(max_length=200)


class ModelsArgs(Args):
    models: list[Annotated[str, Field(max_length=200)]] = Field(min_length=1, max_length=64)

    def check(self, catalog: Catalog) -> None:
        for model in self.models:
            catalog.model(model)


class StageArgs(ModelArgs):
    # A fleet rollout's peer box that already holds the weights (adapters/weights_peer.py checks each field
    # as deploy.toml's host entries are checked).
    peer: dict[str, str | int | None] | None = None


class SwitchArgs(ModelArgs):
    no_rollback: bool = False
    force: bool = False


class HostArgs(Args):
    host: str | None = Field(None, max_length=200)


class RollbackArgs(HostArgs):
    to_revision: int | None = Field(None, ge=1, le=2**31 - 1)


class HistoryArgs(HostArgs):
    limit: int = Field(50, ge=1, le=10_000)


class ConfigPushArgs(Args):
    text: str = Field(max_length=900_000)
    name: str | None = Field(None, max_length=200)


@dataclass(frozen=True)
class Call:
    """Who asks and who listens: ``trigger`` is recorded in the audit trail (None: this CLI's user)."""

    progress: ProgressCallback | None = None
    trigger: str | None = None
    next_runs: dict[str, float] | None = None  # the agent's schedule clock, for `schedules`


Runner = Callable[[Operations, Any, Call], Any]


@dataclass(frozen=True)
class OpSpec:
    """One operation. ``host`` set: a job that holds that host while it runs (the agent runs one per
    host, in the background, streaming progress); unset: a query answered at once."""

    name: str
    args: type[Args]
    run: Runner
    host: Callable[[Operations, Any], str] | None = None

    def parse(self, catalog: Catalog, raw: object) -> Args:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise UsageError(f"{self.name}: args must be a JSON object, got {_short(raw)}")
        try:
            args = self.args.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "args"
            raise UsageError(f"{self.name}: argument {where}: {first['msg']} (got {_short(first.get('input'))})"
                             ) from None
        args.check(catalog)
        return args


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _rollback_trigger(call: Call) -> str:
    # For people reading history: the engine knows a rollback by its record (Deployment.restores).
    return f"rollback by {call.trigger}" if call.trigger else "rollback"


_TABLE = [
    OpSpec("switch", SwitchArgs,
           lambda ops, a, c: ops.switch(a.model, trigger=c.trigger, no_rollback=a.no_rollback, force=a.force,
                                        progress=c.progress),
           host=lambda ops, a: ops.host_of(a.model)),
    OpSpec("rollback", RollbackArgs,
           lambda ops, a, c: ops.rollback(a.host, a.to_revision, trigger=_rollback_trigger(c), progress=c.progress),
           host=lambda ops, a: ops.resolve_host(a.host)),
    OpSpec("recover", HostArgs,
           lambda ops, a, c: {"recovered": ops.recover(a.host, progress=c.progress)},
           host=lambda ops, a: ops.resolve_host(a.host)),
    OpSpec("stop", ModelArgs, lambda ops, a, c: ops.stop(a.model, progress=c.progress),
           host=lambda ops, a: ops.host_of(a.model)),
    OpSpec("stage", StageArgs, lambda ops, a, c: ops.stage(a.model, peer=a.peer, progress=c.progress),
           host=lambda ops, a: ops.host_of(a.model)),
    OpSpec("status", HostArgs,
           lambda ops, a, c: {**ops.status(a.host), "schedules": ops.schedules(time.time(), c.next_runs)}),
    # What a CLI with --host asks before it sends one switch per model (core/proxy.check_together), and
    # what `switch --dry-run` prints: both read the box's own catalog and records.
    OpSpec("check_together", ModelsArgs, lambda ops, a, c: {"host": check_together(ops.catalog, a.models)}),
    OpSpec("explain", ModelArgs, lambda ops, a, c: ops.explain(a.model)),
    OpSpec("history", HistoryArgs, lambda ops, a, c: ops.history(a.host, a.limit)),
    OpSpec("schedules", NoArgs, lambda ops, a, c: ops.schedules(time.time(), c.next_runs)),
    # Answered by the agent itself (its pid; the progress of running jobs); in-process, nothing runs
    # in the background.
    OpSpec("ping", NoArgs, lambda ops, a, c: {"pid": os.getpid()}),
    OpSpec("follow", HostArgs, lambda ops, a, c: {"followed": []}),
]

OPERATIONS: dict[str, OpSpec] = {spec.name: spec for spec in _TABLE}


def _agent_only(ops: Operations, args: Any, call: Call) -> Any:
    raise UsageError("config show/push act on a running agent's deploy.toml: start the agent, or use --host")


# Answered by the agent from the file it was started with (agent/daemon.py); nothing in-process.
AGENT_OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec("config_show", NoArgs, _agent_only),
    OpSpec("config_push", ConfigPushArgs, _agent_only),
]}


def lookup(op: object) -> OpSpec:
    """The operation called ``op``, or a UsageError listing them."""
    if not isinstance(op, str) or op not in OPERATIONS:
        known = sorted([*OPERATIONS, *AGENT_OPS])
        raise UsageError(f"unknown operation {_short(op)}: op must be one of {', '.join(known)}")
    return OPERATIONS[op]
