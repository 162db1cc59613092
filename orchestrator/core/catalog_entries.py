"""The entries of deploy.toml as validated, immutable data: defaults, hosts, models, schedules,
policy, groups, the front proxy. Rules that need more than one entry live in ``core.catalog``.

One module per role (catalog_hosts, catalog_models, catalog_policies); this one names them all.
"""

from __future__ import annotations

from orchestrator.core.catalog_hosts import Defaults, Host
from orchestrator.core.catalog_models import Model
from orchestrator.core.catalog_policies import Demand, Group, Policy, Proxy, Schedule

__all__ = ["Defaults", "Demand", "Group", "Host", "Model", "Policy", "Proxy", "Schedule"]
