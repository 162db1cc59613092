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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.contract.operation import Operation, Who, short
from orchestrator.contract.sides import AgentSide, Caller
from orchestrator.contract.wire import error_reply
from orchestrator.errors import OrchestratorError, UsageError

if TYPE_CHECKING:  # the argument models load with the first parse: a client never needs pydantic
    from orchestrator.contract.args import (
        AdoptArgs,
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
    from orchestrator.core.switch_plan import check_together  # core loads the catalog (pydantic): not for clients

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
# What a CLI asks before it sends one switch per model (core/switch_plan.check_together), and what `switch
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
        raise UsageError(f"unknown operation {short(op)}: op must be one of {', '.join(sorted(OPERATIONS))}")
    return OPERATIONS[op]
