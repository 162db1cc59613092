"""Every path-valued key of deploy.toml is root's to change through a push, unless listed as safe for
members with the reason: a key added later is caught here until someone decides which it is."""

from __future__ import annotations

from pydantic import BaseModel

from orchestrator.core import privilege
from orchestrator.core.catalog import Catalog, Group, Host, Model, Proxy
from orchestrator.core.catalog_hosts import Defaults
from orchestrator.core.dashboard import Dashboard

# What makes a key path-valued: how its name ends, or a default that is an absolute path.
PATHY = (
    "socket",
    "path",
    "dir",
    "key",
    "known_hosts",
    "python",
    "engine",
    "haproxy",
    "ray",
    "config",
    "source",
    "patterns",
)

SECTIONS: dict[str, tuple[type[BaseModel], tuple[str, ...]]] = {
    "": (Catalog, privilege.ROOT_ONLY_TOP),
    "defaults": (Defaults, privilege.ROOT_ONLY_DEFAULTS),
    "proxy": (Proxy, privilege.ROOT_ONLY_PROXY),
    "dashboard": (Dashboard, privilege.ROOT_ONLY_DASHBOARD),
    "hosts": (Host, privilege.ROOT_ONLY_HOST),
    "groups": (Group, privilege.ROOT_ONLY_GROUP),
    "models": (Model, privilege.ROOT_ONLY_MODEL),
}


def test_every_path_valued_key_is_root_only_or_shown_safe() -> None:
    """A key that names a file, directory, socket or executable is root-only or in MEMBER_PATHS."""
    unclaimed = []
    for section, (model, root_only) in SECTIONS.items():
        for name, field in model.model_fields.items():
            default = field.default
            pathy = name.endswith(PATHY) or (isinstance(default, str) and default.startswith("/"))
            key = f"{section}.{name}" if section else name
            if pathy and name not in root_only and key not in privilege.MEMBER_PATHS:
                unclaimed.append(key)
    assert unclaimed == []
