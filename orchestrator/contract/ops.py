"""The operations, each declared once: name, arguments, result, who may run it, and how it runs.

The agent's socket, the in-process backend and the fleet fan-out all read this table, so adding an
operation is one entry here, one ``Operations`` method and one CLI command. An entry with ``job``
set changes a box: it holds that host while it runs (the agent runs one per host, in the background,
streaming progress); without it, it is a query answered at once. An entry without ``run`` is
agent-only: it is answered by a running agent (``agent``), never in-process. An entry of
``Who.AGENT`` is one the agent runs itself (on demand's idle sleep and stop, its front proxy's reroute,
start and stop), through this table like a client's request, and refuses to every client: every
operation the agent runs is one of this table (agent/server.Job refuses any other).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from orchestrator.contract.wire import error_reply
from orchestrator.errors import AgentError, OrchestratorError, Refused, UsageError

if TYPE_CHECKING:  # the argument models load with the first parse: a client never needs pydantic
    from orchestrator.contract.args import (
        AdoptArgs,
        Args,
        ConfigPushArgs,
        DoctorArgs,
        HistoryArgs,
        HostArgs,
        IdleArgs,
        ModelArgs,
        ModelsArgs,
        NoArgs,
        ProxyArgs,
        RollbackArgs,
        RolloutAbortArgs,
        RolloutIdArgs,
        RolloutStartArgs,
        StageArgs,
        SwitchArgs,
        TuneArgs,
        TuneHostArgs,
    )
    from orchestrator.core.catalog import Catalog, Host
    from orchestrator.deploy.operations import Operations
    from orchestrator.ports import ProgressCallback

A = TypeVar("A", bound="Args")
R = TypeVar("R")


class Who(Enum):
    """Who may run an operation. The socket lets in root, the agent's user and the socket group's members
    (agent/server.authorized) before it reads a byte; then each request is held to its entry's ``who``
    (``Operation.admit``) from the peer's uid: root may run everything a client may ask (Who.AGENT's
    entries are the agent's own: no client asks them)."""

    MEMBERS = "root and the members of the socket group"
    # A member may, except for what the entry's ``privileged`` finds in the request (core/privilege.py).
    MEMBERS_ROOT_FOR_PRIVILEGED = (
        "root and the members of the socket group; a change that decides what "
        "runs as root needs root (core/privilege.py)"
    )
    ROOT = "root only"
    # The agent's own box operations (on demand's idle sleep and stop, the proxy's reroute, start and stop
    # after a push or at its start): the agent runs them from this table; no client may ask, root neither.
    AGENT = "the agent itself, never a client"


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


@dataclass(frozen=True)
class Operation(Generic[A, R]):
    name: str
    # The name of its argument model in contract/args.py, imported with the first parse (a class works
    # too, but imports pydantic with this module: tests/unit/test_cli_start.py says so)
    args: str | type[A]
    result: type[R]  # what the answer is (dict or list), checked where a client reads it
    command: str | None  # the CLI command that runs it (None: asked by the client itself)
    run: Callable[[Operations, A, Caller], R] | None = None  # in-process; None: agent-only
    agent: Callable[[AgentSide, A, Caller], R] | None = None  # how an agent answers instead of ``run``
    stream: Callable[[AgentSide, A], Iterator[dict[str, Any]]] | None = None  # an agent's streamed answer
    # The host this job holds, resolved in parse (args.on); None from it: every host (in-process only)
    job: Callable[[Catalog, A], Host | None] | None = None
    boxes: Callable[[Catalog, A], list[str]] | None = None  # locked in-process (default: the job's host)
    who: Who = Who.MEMBERS
    # Who.MEMBERS_ROOT_FOR_PRIVILEGED: what of this request only root may do (empty: a member may run it)
    privileged: Callable[[AgentSide, A], list[str]] | None = None

    @property
    def agent_only(self) -> bool:
        return self.run is None

    @property
    def reads_only(self) -> bool:
        """A query: it holds no host and locks no box, so in-process it opens the stores read-only."""
        return self.job is None and self.boxes is None

    def parse(self, catalog: Catalog, raw: object) -> A:
        """The arguments of a request, checked: types and ranges, then names against the catalog."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise UsageError(f"{self.name}: args must be a JSON object, got {_short(raw)}")
        from pydantic import ValidationError

        try:
            args = self.arg_model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "args"
            raise UsageError(
                f"{self.name}: argument {where}: {first['msg']} (got {_short(first.get('input'))})"
            ) from None
        args.check(catalog)
        host = None if self.job is None else self.job(catalog, args)
        args._on = None if host is None else host.name
        return args

    @property
    def arg_model(self) -> type[A]:
        if not isinstance(self.args, str):
            return self.args
        from orchestrator.contract import args

        model: type[A] = getattr(args, self.args)
        return model

    def admit(self, agent: AgentSide, args: A, caller: Caller) -> None:
        """Refuse (exit 5) a caller the entry's ``who`` does not let run this request, before it runs."""
        if self.who is Who.AGENT:
            raise Refused(
                f"{self.name} by {caller.trigger}: the agent runs it itself (on-demand idle "
                "models, its front proxy), no client may ask it"
            )
        if caller.uid == 0 or self.who is Who.MEMBERS:
            return
        if self.who is Who.ROOT:
            raise Refused(f"{self.name} by {caller.trigger}: only root may run it")
        changes = [] if self.privileged is None else self.privileged(agent, args)
        if changes:
            raise Refused(
                f"{self.name} by {caller.trigger}: only root may change {', '.join(changes[:6])}"
                + (f" and {len(changes) - 6} more" if len(changes) > 6 else "")
                + ": these decide what the agent runs or writes as root and as whom the engines run "
                "(do it as root, or edit the agent's deploy.toml on the box as root); nothing was "
                "changed"
            )

    def locks(self, catalog: Catalog, args: A) -> list[str]:
        """The boxes an in-process run holds (agentless: each one's own lock)."""
        if self.boxes is not None:
            return self.boxes(catalog, args)
        return [] if args.on is None else [args.on]

    def in_process(self, ops: Operations, args: A, caller: Caller) -> R:
        if self.run is None:
            raise UsageError(
                f"{self.name} acts on a running agent (its deploy.toml, its jobs): start the agent, or use --host"
            )
        return self.run(ops, args, caller)

    def in_agent(self, agent: AgentSide, args: A, caller: Caller) -> R:
        """A query's answer in the agent: its own (``agent``), else the in-process one on its Operations."""
        if self.agent is not None:
            return self.agent(agent, args, caller)
        return self.in_process(agent.ops, args, caller)

    def reply(self, value: object, where: str) -> R:
        """A client's reading of the result: the declared shape, or an AgentError naming what came."""
        if not isinstance(value, self.result):
            raise AgentError(f"{where} answered {self.name} with {_short(value)}: expected a {self.result.__name__}")
        return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _trigger(caller: Caller, rollout: str | None) -> str | None:
    """Who asked, for the audit trail; a fleet controller's request names its rollout first, the login
    the box authenticated (the controller's) after it."""
    if rollout is None:
        return caller.trigger
    return f"{rollout} (via {caller.trigger})" if caller.trigger else rollout


def _rollback_trigger(caller: Caller, rollout: str | None = None) -> str:
    # For people reading history: the engine knows a rollback by its record (Deployment.restores).
    who = _trigger(caller, rollout)
    return f"rollback by {who}" if who else "rollback"


def _status(ops: Operations, a: HostArgs, c: Caller) -> dict[str, Any]:
    return {**ops.status(a.host), "schedules": ops.schedules(time.time(), c.next_runs)}


def _preflight(ag: AgentSide) -> dict[str, Any]:
    def part(answer: Callable[[], Any]) -> dict[str, Any]:
        try:
            return {"result": answer()}
        except OrchestratorError as exc:  # one part's refusal is that part's answer, as if asked alone
            return error_reply(exc)

    return {
        "config_show": part(ag.config_show),
        "status": part(lambda: {**ag.ops.status(None), "agent": ag.info()}),
        "history": part(lambda: ag.annotate(ag.ops.history(None, 1))),
    }


def _check_together(ops: Operations, a: ModelsArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.core.proxy import check_together  # its templates are not needed to name an operation

    return {"host": check_together(ops.catalog, a.models)}


def _every_host_or(catalog: Catalog, a: HostArgs) -> list[str]:
    # recover with no --on finishes what is unfinished on every host, so it holds every box
    return [a.on] if a.on is not None else list(catalog.hosts)


def _host_or_every(catalog: Catalog, a: HostArgs) -> Host | None:
    # recover: with several hosts and no --on, every host (an agent asks which: Agent._start)
    return catalog.target(host=a.host) if a.host is not None or len(catalog.hosts) == 1 else None


def _model_host(catalog: Catalog, a: ModelArgs) -> Host:
    return catalog.target(model=a.model)


def _host(catalog: Catalog, a: HostArgs) -> Host:
    return catalog.target(host=a.host)


def _proxy_host(catalog: Catalog, a: ProxyArgs) -> Host:
    return catalog.target(host=a.host)


# The agent's own box operations (deploy/demand_ops.py), imported where they run: the deploy stack is never
# loaded to name an operation (tests/unit/test_cli_start.py).
def _demand_sleep(ops: Operations, a: IdleArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import sleep_idle

    return sleep_idle(ops, a.model, reason=a.reason, progress=c.progress)


def _demand_stop(ops: Operations, a: IdleArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import stop_idle

    return stop_idle(ops, a.model, reason=a.reason, progress=c.progress)


def _reroute(ops: Operations, a: ProxyArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import reroute

    return {"reloaded": reroute(ops, a.host, reason=a.reason)}


def _proxy_up(ops: Operations, a: ProxyArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import proxy_up

    return {"changed": proxy_up(ops, a.host, reason=a.reason)}


def _proxy_off(ops: Operations, a: ProxyArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import proxy_off

    return {"was_running": proxy_off(ops, a.host, reason=a.reason)}


def _leftover_proxy_off(ops: Operations, a: ProxyArgs, c: Caller) -> dict[str, Any]:
    from orchestrator.deploy.demand_ops import leftover_proxy_off

    return {"done": leftover_proxy_off(ops, a.host, reason=a.reason)}


SWITCH: Operation[SwitchArgs, dict[str, Any]] = Operation(
    "switch",
    "SwitchArgs",
    dict,
    "switch",
    run=lambda ops, a, c: ops.switch(
        a.model, trigger=_trigger(c, a.rollout), no_rollback=a.no_rollback, force=a.force, progress=c.progress
    ),
    job=_model_host,
)
ROLLBACK: Operation[RollbackArgs, dict[str, Any]] = Operation(
    "rollback",
    "RollbackArgs",
    dict,
    "rollback",
    run=lambda ops, a, c: ops.rollback(
        a.host, a.to_revision, trigger=_rollback_trigger(c, a.rollout), progress=c.progress
    ),
    job=_host,
)
RECOVER: Operation[HostArgs, dict[str, Any]] = Operation(
    "recover",
    "HostArgs",
    dict,
    "recover",
    run=lambda ops, a, c: {"recovered": ops.recover(a.host, progress=c.progress)},
    job=_host_or_every,
    boxes=_every_host_or,
)
STOP: Operation[ModelArgs, dict[str, Any]] = Operation(
    "stop", "ModelArgs", dict, "stop", run=lambda ops, a, c: ops.stop(a.model, progress=c.progress), job=_model_host
)
STAGE: Operation[StageArgs, dict[str, Any]] = Operation(
    "stage",
    "StageArgs",
    dict,
    "stage",
    run=lambda ops, a, c: ops.stage(a.model, peer=a.peer, progress=c.progress),
    job=_model_host,
)
STATUS: Operation[HostArgs, dict[str, Any]] = Operation(
    "status",
    "HostArgs",
    dict,
    "status",
    run=_status,
    agent=lambda ag, a, c: {**_status(ag.ops, a, c), "agent": ag.info()},
)
# What a CLI asks before it sends one switch per model (core/proxy.check_together), and what `switch
# --dry-run` prints: both read the catalog and records of whoever answers (with --host: the box's).
CHECK_TOGETHER: Operation[ModelsArgs, dict[str, Any]] = Operation(
    "check_together", "ModelsArgs", dict, "switch", run=_check_together
)
EXPLAIN: Operation[ModelArgs, dict[str, Any]] = Operation(
    "explain", "ModelArgs", dict, "switch --dry-run", run=lambda ops, a, c: ops.explain(a.model)
)
HISTORY: Operation[HistoryArgs, list[Any]] = Operation(
    "history",
    "HistoryArgs",
    list,
    "history",
    run=lambda ops, a, c: ops.history(a.host, a.limit),
    agent=lambda ag, a, c: ag.annotate(ag.ops.history(a.host, a.limit)),
)
SCHEDULES: Operation[NoArgs, list[Any]] = Operation(
    "schedules", "NoArgs", list, "schedules", run=lambda ops, a, c: ops.schedules(time.time(), c.next_runs)
)
# A first-contact report of a box (core/doctor.py): asked of whoever runs the engines there (the agent, as
# root), since the interpreter is run as the engines' user in a transient unit.
DOCTOR: Operation[DoctorArgs, dict[str, Any]] = Operation(
    "doctor", "DoctorArgs", dict, "doctor", run=lambda ops, a, c: ops.doctor(a.host, a.models)
)
# The engines a box runs outside the product (hand-written units, processes started by hand), each with
# its deploy.toml entry for review (core/adopt.py); then, once the entries are pushed, a revision per engine
# that records what runs now (trigger "adopt"): a job holding the host.
ADOPT: Operation[AdoptArgs, dict[str, Any]] = Operation(
    "adopt", "AdoptArgs", dict, "adopt", run=lambda ops, a, c: ops.adopt(a.host, a.units, a.pids)
)
ADOPT_RECORD: Operation[AdoptArgs, dict[str, Any]] = Operation(
    "adopt_record",
    "AdoptArgs",
    dict,
    "adopt --apply",
    run=lambda ops, a, c: ops.adopt_record(a.host, a.units, a.pids),
    job=_host,
)
# Is an agent there (the client's own question); its pid.
PING: Operation[NoArgs, dict[str, Any]] = Operation(
    "ping", "NoArgs", dict, None, run=lambda ops, a, c: {"pid": os.getpid()}
)
# The progress of running jobs: an agent streams it; in-process nothing runs in the background.
FOLLOW: Operation[HostArgs, dict[str, Any]] = Operation(
    "follow",
    "HostArgs",
    dict,
    "status --follow",
    run=lambda ops, a, c: {"followed": []},
    stream=lambda ag, a: ag.follow(a.host),
)
# Answered by the agent from the file it was started with; nothing in-process.
CONFIG_SHOW: Operation[NoArgs, dict[str, Any]] = Operation(
    "config_show", "NoArgs", dict, "config show", agent=lambda ag, a, c: ag.config_show()
)
CONFIG_PUSH: Operation[ConfigPushArgs, dict[str, Any]] = Operation(
    "config_push",
    "ConfigPushArgs",
    dict,
    "config push",
    agent=lambda ag, a, c: ag.config_push(a.text, a.name, c),
    who=Who.MEMBERS_ROOT_FOR_PRIVILEGED,
    privileged=lambda ag, a: ag.root_only_changes(a.text, a.name),
)
# What a fleet controller asks each box before a rollout (rollout/preflight.py), in one round trip: the
# box's deploy.toml, its status and its newest deployment, each part a result or the error it raised.
PREFLIGHT: Operation[NoArgs, dict[str, Any]] = Operation(
    "preflight", "NoArgs", dict, "rollout", agent=lambda ag, a, c: _preflight(ag)
)
# A fleet's rollouts, run by the controller's agent (agent/controller.py), whoever asks: start returns
# once the rollout is recorded (preflight refusals come back here), follow streams it to its end.
ROLLOUT_START: Operation[RolloutStartArgs, dict[str, Any]] = Operation(
    "rollout_start", "RolloutStartArgs", dict, "rollout", agent=lambda ag, a, c: ag.controller.start(a, c.trigger)
)
ROLLOUT_FOLLOW: Operation[RolloutIdArgs, dict[str, Any]] = Operation(
    "rollout_follow", "RolloutIdArgs", dict, "rollout status --follow", stream=lambda ag, a: ag.controller.follow(a.id)
)
ROLLOUT_STATUS: Operation[RolloutIdArgs, dict[str, Any]] = Operation(
    "rollout_status", "RolloutIdArgs", dict, "rollout status", agent=lambda ag, a, c: ag.controller.summary(a.id)
)
ROLLOUT_RESUME: Operation[RolloutIdArgs, dict[str, Any]] = Operation(
    "rollout_resume", "RolloutIdArgs", dict, "rollout resume", agent=lambda ag, a, c: ag.controller.resume(a.id)
)
ROLLOUT_ABORT: Operation[RolloutAbortArgs, dict[str, Any]] = Operation(
    "rollout_abort",
    "RolloutAbortArgs",
    dict,
    "rollout abort",
    agent=lambda ag, a, c: ag.controller.abort(a.id, a.rollback_all),
)
# A tune run, as a job of the agent that owns the model's host (agent/tune_jobs.py): the plan (staging
# and the planner, before anything stops), the run, and what re-attaches to it from any client.
TUNE_PLAN: Operation[TuneArgs, dict[str, Any]] = Operation(
    "tune_plan", "TuneArgs", dict, "tune", stream=lambda ag, a: ag.tuner.plan(a)
)
TUNE_START: Operation[TuneArgs, dict[str, Any]] = Operation(
    "tune_start", "TuneArgs", dict, "tune", stream=lambda ag, a: ag.tuner.start(a)
)
TUNE_RESUME: Operation[TuneHostArgs, dict[str, Any]] = Operation(
    "tune_resume", "TuneHostArgs", dict, "tune --resume", stream=lambda ag, a: ag.tuner.resume(a)
)
TUNE_ABORT: Operation[TuneHostArgs, dict[str, Any]] = Operation(
    "tune_abort", "TuneHostArgs", dict, "tune --abort", stream=lambda ag, a: ag.tuner.abort(a)
)
TUNE_FOLLOW: Operation[TuneHostArgs, dict[str, Any]] = Operation(
    "tune_follow", "TuneHostArgs", dict, "tune --follow", stream=lambda ag, a: ag.tuner.follow(a)
)
TUNE_STATUS: Operation[TuneHostArgs, dict[str, Any]] = Operation(
    "tune_status", "TuneHostArgs", dict, "tune --status", agent=lambda ag, a, c: ag.tuner.status(a)
)
# The agent's own box operations (Who.AGENT: refused to every client), run by it through this table
# (deploy/demand_ops.py): an idle on-demand model put to sleep or stopped (the broker's jobs, holding the
# model's host), and a host's front proxy re-rendered, started or stopped after a push or at the agent's
# start (each under the host's lock, answered in the push or the start).
DEMAND_SLEEP: Operation[IdleArgs, dict[str, Any]] = Operation(
    "demand_sleep", "IdleArgs", dict, None, run=_demand_sleep, job=_model_host, who=Who.AGENT
)
DEMAND_STOP: Operation[IdleArgs, dict[str, Any]] = Operation(
    "demand_stop", "IdleArgs", dict, None, run=_demand_stop, job=_model_host, who=Who.AGENT
)
REROUTE: Operation[ProxyArgs, dict[str, Any]] = Operation(
    "reroute", "ProxyArgs", dict, None, run=_reroute, job=_proxy_host, who=Who.AGENT
)
PROXY_UP: Operation[ProxyArgs, dict[str, Any]] = Operation(
    "proxy_up", "ProxyArgs", dict, None, run=_proxy_up, job=_proxy_host, who=Who.AGENT
)
PROXY_OFF: Operation[ProxyArgs, dict[str, Any]] = Operation(
    "proxy_off", "ProxyArgs", dict, None, run=_proxy_off, job=_proxy_host, who=Who.AGENT
)
LEFTOVER_PROXY_OFF: Operation[ProxyArgs, dict[str, Any]] = Operation(
    "leftover_proxy_off", "ProxyArgs", dict, None, run=_leftover_proxy_off, job=_proxy_host, who=Who.AGENT
)

# Every entry above, in the order declared: a new one needs no second listing.
OPERATIONS: dict[str, Operation[Any, Any]] = {
    value.name: value for value in list(globals().values()) if isinstance(value, Operation)
}


def lookup(op: object) -> Operation[Any, Any]:
    """The operation called ``op``, or a UsageError listing them."""
    if not isinstance(op, str) or op not in OPERATIONS:
        raise UsageError(f"unknown operation {_short(op)}: op must be one of {', '.join(sorted(OPERATIONS))}")
    return OPERATIONS[op]
