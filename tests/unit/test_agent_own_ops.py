"""The operation table is the one list of what the agent runs: a job of any other name is refused, every
name the agent's code starts a job under is declared, and the agent's own box operations (on demand's idle
sleep and stop, its front proxy's reroute, start and stop) are entries no client may ask."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from orchestrator import agent as agent_package
from orchestrator.agent.daemon import Agent
from orchestrator.agent.server import Job, Jobs
from orchestrator.contract.operation import Who
from orchestrator.contract.ops import OPERATIONS
from orchestrator.errors import AgentError, Refused

from .conftest import OpsWorld
from .test_contract import SAMPLE_ARGS

AGENTS_OWN = sorted(name for name, op in OPERATIONS.items() if op.who is Who.AGENT)


def test_a_job_of_an_operation_the_table_does_not_declare_is_refused(tmp_path: Path) -> None:
    """Jobs.submit of a name not in contract/ops.py: AgentError naming it, nothing runs, the host stays free."""
    world = OpsWorld(tmp_path)
    jobs = Jobs(world.ops, on_finish=lambda job: None)
    ran: list[str] = []
    with pytest.raises(AgentError, match=r"job 'demand_nap' on host box: not an operation of the table"):
        jobs.submit("box", "demand_nap", {"model": "alpha"}, lambda job: ran.append("ran") or {})
    assert ran == [] and jobs.busy("box") is None


def _job_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every literal operation name a job is started under: Job(host, OP, ...),
    x.submit(host, OP, ...), x._submit(host, OP, ...)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        f = node.func
        called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        op = node.args[1]
        if called in ("Job", "submit", "_submit") and isinstance(op, ast.Constant) and isinstance(op.value, str):
            out.append((node.lineno, op.value))
    return out


def test_every_job_the_agents_code_starts_names_a_declared_operation() -> None:
    """Each literal name the agent's modules start a job under (Job, submit) is an entry of the table."""
    root = Path(agent_package.__file__).parent
    found, undeclared = 0, []
    for path in sorted(root.glob("*.py")):
        for line, name in _job_names(ast.parse(path.read_text(), str(path))):
            found += 1
            if name not in OPERATIONS:
                undeclared.append(f"{path.name}:{line}: {name!r}")
    assert found >= 5  # the scan sees the agent's jobs (tune's, the controller's)
    assert undeclared == []


def test_a_job_under_a_declared_name_is_a_job_of_that_entry() -> None:
    """A Job of a declared name keeps it (the controller's, tune's and the broker's jobs use the table's)."""
    assert Job("box", "demand_sleep", {"model": "alpha"}).op == "demand_sleep"


def test_the_agents_own_operations_are_on_demand_and_the_front_proxy() -> None:
    """Who.AGENT's entries: the broker's idle sleep and stop, the proxy's reroute, start and stops."""
    assert AGENTS_OWN == ["demand_sleep", "demand_stop", "leftover_proxy_off", "proxy_off", "proxy_up", "reroute"]


@pytest.mark.parametrize("uid", [0, 1000, None])
@pytest.mark.parametrize("name", AGENTS_OWN)
def test_no_client_may_ask_the_agents_own_operations(tmp_path: Path, name: str, uid: int | None) -> None:
    """Asked over the socket, by root as by a member: refused (exit 5) naming it and the caller; nothing runs."""
    world = OpsWorld(tmp_path)
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    before = world.store.events(limit=10_000)
    with pytest.raises(Refused, match=rf"{name} by tester@socket: the agent runs it itself"):
        list(agent.dispatch(name, SAMPLE_ARGS[name], "tester@socket", uid=uid))
    assert agent.jobs.busy("box") is None and world.store.events(limit=10_000) == before


def test_the_idle_sleep_is_run_as_the_tables_demand_sleep(tmp_path: Path) -> None:
    """The broker's idle sleep is a job of the demand_sleep entry, and answers as sleep_idle does."""
    from .test_demand_broker import SHARED, DemandWorld

    dw = DemandWorld(tmp_path, models={"a": {"repo": "org/a", "port": 8001, **SHARED, "idle_sleep_s": 60}})
    dw.broker.open("a")
    dw.run_swap()
    dw.clock.sleep(61)
    dw.broker.idle_tick()
    job = dw.broker.idle_jobs["box"]
    assert job.done.wait(10)
    result: dict[str, Any] = (job.result or {}).get("result", {})
    assert (job.op, job.args, result.get("outcome")) == ("demand_sleep", {"model": "a"}, "asleep")
