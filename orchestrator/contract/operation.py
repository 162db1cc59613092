"""An operation as the table declares it (contract/ops.py): its name, arguments and result, who may run
it (``Who``), and how each side runs it: parsed and checked against the catalog, admitted by the caller's
uid, run in-process or by a running agent, its answer read back by a client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from orchestrator.contract.sides import AgentSide, Caller
from orchestrator.errors import AgentError, Refused, UsageError

if TYPE_CHECKING:  # the argument models load with the first parse: a client never needs pydantic
    from orchestrator.contract.args import Args
    from orchestrator.core.catalog import Catalog, Host
    from orchestrator.deploy.operations import Operations

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
            raise UsageError(f"{self.name}: args must be a JSON object, got {short(raw)}")
        from pydantic import ValidationError

        try:
            args = self.arg_model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "args"
            raise UsageError(
                f"{self.name}: argument {where}: {first['msg']} (got {short(first.get('input'))})"
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
            raise AgentError(f"{where} answered {self.name} with {short(value)}: expected a {self.result.__name__}")
        return value


def short(value: object) -> str:
    """``value`` as a message quotes it: its repr, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
