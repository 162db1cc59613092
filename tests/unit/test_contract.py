"""The operation contract (orchestrator/contract): each operation declared once, with a CLI command and
an Operations method; the wire's reply reader; what the agent and the backends do with the table."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.agent.daemon import Agent
from orchestrator.cli import main
from orchestrator.client.backends import AgentClient, LocalBackend
from orchestrator.contract.ops import CONFIG_SHOW, OPERATIONS, RECOVER, STATUS
from orchestrator.contract.sides import Caller
from orchestrator.contract.wire import Event, ReplyReader, encode, error_reply
from orchestrator.deploy.operations import Operations
from orchestrator.errors import AgentError, Busy, OrchestratorError, UsageError

from .conftest import OpsWorld, make_catalog

# A valid request of each operation against OpsWorld's catalog.
SAMPLE_ARGS: dict[str, dict[str, Any]] = {
    "switch": {"model": "alpha"},
    "rollback": {},
    "recover": {},
    "stop": {"model": "alpha"},
    "stage": {"model": "alpha"},
    "status": {},
    "check_together": {"models": ["alpha", "gamma"]},
    "explain": {"model": "alpha"},
    "doctor": {},
    "adopt": {},
    "adopt_record": {"units": ["vllm-x.service"]},
    "history": {},
    "schedules": {},
    "ping": {},
    "follow": {},
    "config_show": {},
    "config_push": {"text": ""},
    "preflight": {},
    "rollout_start": {"model": "alpha"},
    "rollout_follow": {},
    "rollout_status": {},
    "rollout_resume": {},
    "rollout_abort": {},
    "tune_plan": {"model": "alpha", "concurrency": [1]},
    "tune_start": {"model": "alpha", "concurrency": [1]},
    "tune_resume": {},
    "tune_abort": {},
    "tune_follow": {},
    "tune_status": {},
    "demand_sleep": {"model": "alpha", "reason": "idle"},
    "demand_stop": {"model": "alpha", "reason": "idle"},
    "reroute": {"host": "box", "reason": "test"},
    "proxy_up": {"host": "box", "reason": "test"},
    "proxy_off": {"host": "box", "reason": "test"},
    "leftover_proxy_off": {"host": "box", "reason": "test"},
}


def _command(path: str) -> click.Command | None:
    """The CLI command ``path`` names ("config show", "status --follow"), or None."""
    words = path.split()
    ctx = click.Context(main)
    cmd: click.Command | None = main
    for word in [w for w in words if not w.startswith("--")]:
        cmd = cmd.get_command(ctx, word) if isinstance(cmd, click.Group) else None
        if cmd is None:
            return None
    for flag in [w for w in words if w.startswith("--")]:
        if not any(flag in p.opts for p in cmd.params):
            return None
    return cmd


class Spy:
    """Operations as they are, recording the names of the methods an operation calls."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self.called: list[str] = []

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.ops, name)
        if callable(value):
            self.called.append(name)
        return value


def test_every_declared_entry_is_in_the_table_under_a_name_of_its_own() -> None:
    """Each Operation of contract/ops.py is in OPERATIONS, and no two share a name (one would hide the other)."""
    from orchestrator.contract import ops
    from orchestrator.contract.operation import Operation

    declared = [v for v in vars(ops).values() if isinstance(v, Operation)]
    assert sorted(op.name for op in declared) == sorted(OPERATIONS)
    assert all(OPERATIONS[op.name] is op for op in declared)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_every_operation_names_an_argument_model_of_contract_args(name: str) -> None:
    """The model an entry names (loaded with the first parse) is an Args of contract/args.py."""
    from orchestrator.contract.args import Args

    assert issubclass(OPERATIONS[name].arg_model, Args)


def test_samples_cover_every_declared_operation() -> None:
    """The samples below name every operation of the table, and nothing else."""
    assert sorted(SAMPLE_ARGS) == sorted(OPERATIONS)


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_every_operation_with_a_command_names_a_cli_command_that_exists(name: str) -> None:
    """The command an operation declares is a CLI command (and option) of `orchestrator`."""
    op = OPERATIONS[name]
    if op.command is not None:
        assert _command(op.command) is not None, f"{name}: no CLI command {op.command!r}"


def test_only_ping_and_the_agents_own_have_no_command() -> None:
    """Every operation is run by a CLI command except ping, which the client asks itself, and the agent's
    own box operations (Who.AGENT), which no client asks."""
    from orchestrator.contract.operation import Who

    assert [op.name for op in OPERATIONS.values() if op.command is None and op.who is not Who.AGENT] == ["ping"]
    assert sorted(op.name for op in OPERATIONS.values() if op.who is Who.AGENT) == [
        "demand_sleep",
        "demand_stop",
        "leftover_proxy_off",
        "proxy_off",
        "proxy_up",
        "reroute",
    ]
    assert all(op.command is None for op in OPERATIONS.values() if op.who is Who.AGENT)


def test_every_in_process_operation_calls_an_operations_method(tmp_path: Path) -> None:
    """Run in-process, each operation calls a method of Operations; only ping, follow (nothing runs in
    the background in-process) and check_together (a catalog rule) answer without one."""
    world = OpsWorld(tmp_path)
    without = []
    for name, op in OPERATIONS.items():
        if op.agent_only:
            continue
        spy = Spy(world.ops)
        try:
            op.in_process(spy, op.parse(world.catalog, SAMPLE_ARGS[name]), Caller())  # type: ignore[arg-type]
        except OrchestratorError:
            pass  # refused (nothing to roll back): the method was still the one called
        if not spy.called:
            without.append(name)
    assert sorted(without) == ["check_together", "follow", "ping"]


def test_agent_only_operations_have_an_agent_answer_and_no_in_process_one() -> None:
    """config show/push, a controller's rollouts and an agent's tune runs are answered by an agent only: an
    agent answer (or stream), no in-process run."""
    agent_only = sorted(op.name for op in OPERATIONS.values() if op.agent_only)
    assert agent_only == [
        "config_push",
        "config_show",
        "preflight",
        "rollout_abort",
        "rollout_follow",
        "rollout_resume",
        "rollout_start",
        "rollout_status",
        "tune_abort",
        "tune_follow",
        "tune_plan",
        "tune_resume",
        "tune_start",
        "tune_status",
    ]
    assert all(OPERATIONS[name].agent is not None or OPERATIONS[name].stream is not None for name in agent_only)


def test_every_operation_answers_in_an_agent(tmp_path: Path) -> None:
    """Each declared operation is dispatched by the agent from the table: a result or a project error."""
    world = OpsWorld(tmp_path)
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    for name in OPERATIONS:
        try:
            replies = list(agent.dispatch(name, SAMPLE_ARGS[name], "tester@socket", uid=1000))
        except OrchestratorError:
            continue  # e.g. config show on an agent started without a file
        assert "result" in replies[-1] or "error" in replies[-1], name
    agent.jobs.join(timeout=30)


@pytest.mark.parametrize(("uid", "runs"), [(1000, False), (None, False), (0, True)])
def test_the_agent_holds_each_request_to_its_entrys_who(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uid: int | None, runs: bool
) -> None:
    """An entry declared root-only is refused (exit 5, naming it and the caller) to a member or an unknown
    peer before it runs, whatever its own code does; root runs it."""
    from orchestrator.contract.operation import Operation, Who
    from orchestrator.errors import Refused

    ran: list[str] = []
    probe: Operation[Any, dict[str, Any]] = Operation(
        "probe", "NoArgs", dict, None, run=lambda ops, a, c: ran.append("probe") or {}, who=Who.ROOT
    )
    monkeypatch.setitem(OPERATIONS, "probe", probe)
    world = OpsWorld(tmp_path)
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    if runs:
        assert list(agent.dispatch("probe", {}, "root@socket", uid=uid)) == [{"result": {}}]
    else:
        with pytest.raises(Refused, match=r"probe by tester@socket: only root may run it"):
            list(agent.dispatch("probe", {}, "tester@socket", uid=uid))
    assert ran == (["probe"] if runs else [])


def test_the_agent_refuses_an_undeclared_operation_with_the_usage_exit_code(tmp_path: Path) -> None:
    """An operation not in the table: UsageError (exit 2) listing the declared ones, as the wire carries it."""
    world = OpsWorld(tmp_path)
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    with pytest.raises(UsageError) as err:
        list(agent.dispatch("reboot", {}, "tester@socket"))
    reply = error_reply(err.value)["error"]
    assert (reply["type"], reply["exit_code"]) == ("UsageError", 2)
    assert "unknown operation 'reboot'" in reply["message"] and ", ".join(sorted(OPERATIONS)) in reply["message"]


def test_the_local_backend_refuses_an_agent_only_operation(tmp_path: Path) -> None:
    """config show in-process: a UsageError naming it and saying to start the agent or use --host."""
    with pytest.raises(UsageError, match="config_show acts on a running agent.*start the agent, or use --host"):
        LocalBackend(make_catalog(state_dir=str(tmp_path))).call(CONFIG_SHOW, {})


def test_recover_without_a_host_holds_every_box_in_process(tmp_path: Path) -> None:
    """In-process recover with no --on locks every host of the catalog; with one, that host only."""
    catalog = make_catalog(
        state_dir=str(tmp_path),
        hosts={
            "a": {"transport": "ssh", "address": "127.0.0.9", "gpus": 8},
            "b": {"transport": "ssh", "address": "127.0.0.10", "gpus": 8},
        },
        models={"alpha": {"repo": "org/alpha", "gpus": [0], "host": "a", "port": 8000}},
    )
    assert RECOVER.locks(catalog, RECOVER.parse(catalog, {})) == ["a", "b"]
    assert RECOVER.locks(catalog, RECOVER.parse(catalog, {"host": "b"})) == ["b"]


def test_a_jobs_host_is_resolved_once_where_its_request_is_parsed(tmp_path: Path) -> None:
    """The parsed arguments of a job carry its host (catalog.target): the model's, the named one, the
    only one; a query's none. An unknown name is the catalog's one UsageError, at parse."""
    from orchestrator.contract.ops import ROLLBACK, SWITCH

    catalog = OpsWorld(tmp_path).catalog
    assert SWITCH.parse(catalog, {"model": "alpha"}).on == "box"
    assert ROLLBACK.parse(catalog, {}).on == ROLLBACK.parse(catalog, {"host": "box"}).on == "box"
    assert STATUS.parse(catalog, {}).on is None
    with pytest.raises(UsageError, match=r"unknown model 'nosuch' \(known: alpha"):
        SWITCH.parse(catalog, {"model": "nosuch"})


def test_a_query_takes_no_box_lock(tmp_path: Path) -> None:
    """status changes nothing: in-process it holds no box's lock."""
    catalog = OpsWorld(tmp_path).catalog
    assert STATUS.locks(catalog, STATUS.parse(catalog, {})) == []


def test_the_reply_reader_reads_an_answer_split_anywhere() -> None:
    """Events and the result arrive in pieces that cut lines anywhere: the same events, then the result."""
    data = (
        encode({"event": "phase", "fields": {"phase": "stopping"}})
        + encode({"event": "done"})
        + encode({"result": {"ok": True}})
    )
    for cut in range(1, len(data)):
        reader = ReplyReader()
        events = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert events == [Event("phase", {"phase": "stopping"}), Event("done", {})]
        assert reader.reply is not None and reader.reply.value() == {"ok": True}


def test_the_reply_reader_raises_the_agents_error_type_and_exit_code() -> None:
    """An error reply becomes the same project error, with its message and exit code."""
    reader = ReplyReader()
    reader.feed(encode(error_reply(Busy("host box is busy with switch alpha"))))
    assert reader.reply is not None
    with pytest.raises(Busy, match="busy with switch alpha") as err:
        reader.reply.value()
    assert err.value.exit_code == 5


def _agent_answering(path: str, reply: dict[str, Any]) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rb") as stream:
            json.loads(stream.readline())
            conn.sendall(encode(reply))
        server.close()

    threading.Thread(target=serve, daemon=True).start()


def test_an_answer_of_another_shape_than_declared_is_an_agent_error(tmp_path: Path) -> None:
    """status declares a dict: an agent answering a string gets an AgentError naming the op and the value."""
    path = str(tmp_path / "agent.sock")
    _agent_answering(path, {"result": "fine"})
    with pytest.raises(AgentError, match=r"answered status with 'fine': expected a dict"):
        AgentClient(path).call(STATUS, {})


def test_switch_loads_deploy_toml_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`switch` reads its deploy.toml once (its check of the models and the switch use the same catalog)."""
    from orchestrator import settings

    from .cli_runner import invoke

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("ORCHESTRATOR_HOST", raising=False)
    monkeypatch.delenv("ORCHESTRATOR_SOCKET", raising=False)
    loads: list[str | None] = []
    real = settings.load

    def counting(path: Any = None, **kw: Any) -> Any:
        loads.append(path)
        return real(path, **kw)

    monkeypatch.setattr(settings, "load", counting)
    result = invoke("switch", "no-such-model", "--config", str(repo / "deploy.toml"))
    assert result.exit_code == 2 and "unknown model 'no-such-model'" in result.output, result.output
    assert loads == [str(repo / "deploy.toml")]


def test_a_rollouts_switch_is_recorded_as_the_rollout_via_the_login_the_box_authenticated(tmp_path: Path) -> None:
    """A switch sent with its rollout's label is recorded "rollout #3 by alice (via root@ctl)" in the box's history."""
    from orchestrator.contract.ops import SWITCH

    world = OpsWorld(tmp_path / "state", hosts={"box": {"transport": "local", "gpus": 8, "gpu_memory_gib": 96}})
    args = SWITCH.parse(world.catalog, {"model": "alpha", "rollout": "rollout #3 by alice@laptop"})
    assert SWITCH.run is not None
    SWITCH.run(world.ops, args, Caller(trigger="root@ctl"))
    assert world.ops.history("box")[0]["trigger"] == "rollout #3 by alice@laptop (via root@ctl)"


@pytest.mark.parametrize("label", ["rollout #3 by alice\nFAKE LINE", "anything else", "rollout #x"])
def test_a_rollout_label_that_is_not_one_is_refused(label: str) -> None:
    """The label is a rollout's id and who started it, on one line: anything else is a usage error."""
    from orchestrator.contract.ops import SWITCH

    with pytest.raises(UsageError, match="rollout"):
        SWITCH.parse(make_catalog(), {"model": "alpha", "rollout": label})
