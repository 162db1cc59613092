"""Ports beside the machine: weight staging, the smoke benchmark, the front proxy."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from orchestrator.core.proxy import DEMAND_LUA, HostRouting, render_routing
from orchestrator.core.proxy_move import runtime_move
from orchestrator.core.records import UnitSpec
from orchestrator.core.weights import StagedRevision
from orchestrator.errors import ProxyError
from orchestrator.ports import ProgressCallback, StagedWeights
from orchestrator.resources import template_text


class FakeWeights:
    """A weight store that stages instantly and records what it was asked for."""

    def __init__(self, resolved: str = "0" * 40) -> None:
        self.resolved = resolved
        self.staged: list[str] = []
        self.kept: list[list[str]] = []  # the models each cleanup was told to keep

    def stage(self, spec: UnitSpec, progress: ProgressCallback) -> StagedWeights:
        self.staged.append(spec.model)
        progress("staged", {"model": spec.model})
        return StagedWeights(path=spec.model_dir, revision=spec.revision, total_bytes=0)

    def verify(self, spec: UnitSpec) -> StagedWeights | None:
        return StagedWeights(path=spec.model_dir, revision=spec.revision, total_bytes=0)

    def cleanup(self, keep_serving: Iterable[UnitSpec]) -> list[StagedRevision]:
        self.kept.append(sorted(s.model for s in keep_serving))
        return []


class FakeSmoke:
    """Reports the single-stream tok/s it is told for each unit (default 100)."""

    def __init__(self, rates: dict[str, float] | None = None) -> None:
        self.rates = rates or {}

    def run(self, spec: UnitSpec) -> dict[str, Any]:
        rate = self.rates.get(spec.unit_name, 100.0)
        return {"levels": [{"concurrency": 1, "output_tok_s_per_stream": rate}], "headline_tok_s": rate}


def live_config(config: str) -> str:
    """A rendered config without its disabled servers (a name's alternates that it does not route to):
    the engines that ``config`` sends requests to are the ones left in it."""
    return "".join(ln for ln in config.splitlines(keepends=True) if not ln.rstrip().endswith(" disabled"))


class FakeProxy:
    """The FrontProxy port in memory: the routing it was given and the config the adapter would render
    from it (the shipped template), every apply, and a port a test can take."""

    def __init__(self) -> None:
        self.routing: HostRouting | None = None
        self.config: str | None = None
        self.applied: list[str] = []
        self.prepared: list[str] = []
        self.busy = 0
        self.drains: list[list[tuple[str, int]]] = []
        self.taken_by: str | None = None
        self.stops = 0
        self.counted: dict[tuple[str, int], Any] = {}  # engine -> core.haproxy_cli.Sessions
        self.withdrawn: list[tuple[str, int]] = []  # engines taken out at runtime since the last apply
        self.withdraws = 0  # withdraw calls that took (a test sets ``can_withdraw`` False to refuse them)
        self.can_withdraw = True
        self.moved: list[str] = []  # configs served through ``move`` (the runtime API: no reload)
        self.can_move = True

    def apply(self, routing: HostRouting) -> bool:
        config = render_routing(routing, template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA))
        if self.config == config and not self.withdrawn:
            return False
        self.withdrawn = []
        if self.config is None and self.taken_by:
            raise ProxyError(self.taken_by)
        self.config, self.routing = config, routing
        self.applied.append(config)
        return True

    def move(self, routing: HostRouting) -> bool:
        """Serves ``routing``'s config where it differs from the one served (none withdrawn since) only
        in server states (core/proxy_move.py), kept in ``moved`` (not ``applied``: no reload)."""
        config = render_routing(routing, template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA))
        if self.config is None or self.withdrawn or not self.can_move or not runtime_move(self.config, config):
            return False
        self.config, self.routing = config, routing
        self.moved.append(config)
        return True

    @property
    def routed(self) -> str | None:
        """The config it serves without its disabled servers (``live_config``): the engines it routes to."""
        return None if self.config is None else live_config(self.config)

    def prepare(self, routing: HostRouting) -> None:
        """Renders as apply would and keeps that config in ``prepared``; serves nothing new."""
        self.prepared.append(render_routing(routing, template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA)))

    def draining(self, engines: Sequence[tuple[str, int]]) -> int | None:
        """Counts ``busy`` down, one per poll; every drain's engines are kept in ``drains``."""
        if not self.drains or self.drains[-1] != list(engines):
            self.drains.append(list(engines))
        self.busy = max(0, self.busy - 1)
        return self.busy

    def withdraw(self, engines: Sequence[tuple[str, int]]) -> bool:
        """Takes ``engines`` out until the next apply, which then reloads even an unchanged config."""
        if self.config is None or not self.can_withdraw:
            return False
        self.withdraws += 1
        self.withdrawn = [*self.withdrawn, *engines]
        return True

    def port_holder(self) -> str | None:
        return self.taken_by if self.config is None else None

    def stop(self) -> bool:
        """Serves nothing any more (``config`` None); every stop is counted in ``stops``."""
        was, self.config = self.config is not None, None
        self.stops += 1
        return was

    def sessions(self, engines: Sequence[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        """What a test put in ``counted`` (engine -> Sessions) for the engines asked about."""
        return {e: self.counted[e] for e in engines if e in self.counted}
