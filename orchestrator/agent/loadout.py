"""Everything an agent loads from one deploy.toml, built in one place (no I/O).

The agent builds it at start and `config push` builds it for the pushed file before anything is
written, so a file the agent could not run with is refused (exit 2, nothing changed) instead of
being written first and failing on reload: the schedules with their next run (a cron with no
future fire time is refused here), every model's unit as the engine renders it, and each host's
front proxy config and unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from orchestrator.core import schedule as sched
from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import DEMAND_LUA, render_host, render_unit, routes_for
from orchestrator.core.records import UnitSpec
from orchestrator.deploy.planning import default_template, unit_spec
from orchestrator.errors import RenderError
from orchestrator.resources import template_text


@dataclass(frozen=True)
class Loadout:
    catalog: Catalog
    next_runs: dict[str, float]  # schedule -> its first fire time after the load
    specs: dict[str, UnitSpec]  # model -> its unit(s), rendered for its configured revision
    proxy: dict[str, tuple[str, str]]  # host -> (haproxy.cfg routing all its models, the proxy's unit)


def build(catalog: Catalog, now: float, *, template: str | None = None) -> Loadout:
    """The loadout of ``catalog`` at ``now``; ConfigError or RenderError (exit 2) naming what is wrong.
    ``template``: the default engine's unit template text (the shipped one by default)."""
    for s in catalog.schedules.values():
        sched.validate(s)
    next_runs = sched.first_runs(catalog.schedules, now)
    text = template if template is not None else default_template()
    # a group model is deployed by each box's own agent (a controller's rollout), never by this one
    specs = {name: unit_spec(catalog, model, text) for name, model in catalog.models.items() if model.group is None}
    proxy: dict[str, tuple[str, str]] = {}
    if catalog.proxy.enabled:
        cfg_template, unit_template = template_text("haproxy.cfg.j2"), template_text("orchestrator-proxy.service.j2")
        for name, host in catalog.hosts.items():
            bind = catalog.proxy.bind or host.bind or catalog.defaults.bind
            routes = routes_for(specs[m] for m in catalog.models_on(name) if m in specs)
            try:
                proxy[name] = (
                    render_host(catalog, name, bind, routes, cfg_template, template_text(DEMAND_LUA)),
                    render_unit(catalog.proxy, bind, unit_template),
                )
            except jinja2.TemplateError as exc:
                raise RenderError(f"front proxy of host {name}: template: {exc}", host=name) from exc
    return Loadout(catalog=catalog, next_runs=next_runs, specs=specs, proxy=proxy)
