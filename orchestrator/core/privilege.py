"""What a member of the socket group may change with `config push`, pure.

The agent runs as root. Members of the socket group operate the box: switch, roll back, stage,
tune, and push configs that change models, schedules, policy, ports and the proxy's routing.
They must not become root through the agent, so a push from anyone but root may not change the
settings that decide what root executes, which files root writes or reads, as which user and group
the engines run, or who may use the socket. Those are changed by root only (a push as uid 0, or
editing the file on the box); a member may add a local host or a group with their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.core.catalog import Catalog, Group, Host

# Settings only root may change, by section. Each is an executable root runs, a path root writes,
# reads or deletes under, a credential root uses, an account the engines run as, or the socket's ACL.
ROOT_ONLY_TOP = ("state_dir", "socket_group")
ROOT_ONLY_DEFAULTS = ("user", "group", "engine", "env_dir", "ray", "allow_root")
ROOT_ONLY_PROXY = ("config_path", "stats_socket", "haproxy", "demand_socket", "user", "group")
ROOT_ONLY_HOST = (
    "transport",
    "address",
    "ssh_port",
    "ssh_user",
    "ssh_key",
    "known_hosts",
    "models_dir",
    "unit_dir",
    "python",
    "engine",
    "ray",
    "agent_socket",
)
ROOT_ONLY_GROUP = ("peer_key", "peer_known_hosts")
ROOT_ONLY_DASHBOARD = ("socket",)  # a path the agent binds (and would clear) as root
# A model's files root reads for it: its config.json (a package's shipped one excepted) and a local
# weights directory (copied into models_dir); a hub or peer source names no path.
ROOT_ONLY_MODEL = ("config", "source")
# Path-valued keys a member may set: each names no file root reads, writes or binds.
MEMBER_PATHS = {
    "models.allow_patterns": "glob patterns inside the model's own staged directory",
    "models.ignore_patterns": "glob patterns inside the model's own staged directory",
}


def _get(entry: object, key: str) -> Any:
    return getattr(entry, key, None)


def root_only_changes(running: Catalog, pushed: Catalog, shipped: str = "") -> list[str]:
    """Key paths (with the old and new value) of root-only settings that ``pushed`` changes; ``shipped``:
    the directory of the package's own config.json files, a model's ``config`` a member may name."""
    out: list[str] = []

    def compare(path: str, old: Any, new: Any) -> None:
        if old != new:
            out.append(f"{path} ({old!r} -> {new!r})")

    for key in ROOT_ONLY_TOP:
        compare(key, _get(running, key), _get(pushed, key))
    for key in ROOT_ONLY_DEFAULTS:
        compare(f"defaults.{key}", _get(running.defaults, key), _get(pushed.defaults, key))
    for key in ROOT_ONLY_PROXY:
        compare(f"proxy.{key}", _get(running.proxy, key), _get(pushed.proxy, key))
    for name, host in pushed.hosts.items():
        # A new host starts from a local one's defaults: reaching another box over SSH is root's call.
        before: object = running.hosts.get(name) or Host(name=name, transport="local")
        for key in ROOT_ONLY_HOST:
            compare(f"hosts.{name}.{key}", _get(before, key), _get(host, key))
    for key in ROOT_ONLY_DASHBOARD:
        compare(f"dashboard.{key}", _get(running.dashboard, key), _get(pushed.dashboard, key))
    for name, model in pushed.models.items():
        old_model = running.models.get(name)
        for key in ROOT_ONLY_MODEL:
            new = _get(model, key)
            if not _member_path(key, new, shipped):
                compare(f"models.{name}.{key}", _get(old_model, key), new)
    for name, group in pushed.groups.items():
        old_group: object = running.groups.get(name) or Group(name=name, hosts=group.hosts)
        for key in ROOT_ONLY_GROUP:
            compare(f"groups.{name}.{key}", _get(old_group, key), _get(group, key))
    return out


def unread_paths(running: Mapping[str, Any], pushed: Mapping[str, Any]) -> list[str]:
    """Model files ``pushed`` (a deploy.toml's raw tables) names anew that root would read: a ``config``
    other than a ``shipped:`` one, a ``local:`` source. Found on the text, before validation reads them
    as root and answers with what it found there (a field of a file only root may read)."""
    out: list[str] = []
    old_models = _table(running.get("models"))
    for name, model in _table(pushed.get("models")).items():
        old = _table(old_models.get(name))
        for key in ROOT_ONLY_MODEL:
            new = _table(model).get(key)
            if isinstance(new, str) and new != old.get(key) and not _member_path(key, new, "shipped:"):
                out.append(f"models.{name}.{key} ({old.get(key)!r} -> {new!r})")
    return out


def _table(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _member_path(key: str, value: Any, shipped: str) -> bool:
    """Whether a model's ``config`` or ``source`` value names no file of the box outside the package."""
    if value is None:
        return True
    if key == "config":
        prefix = shipped if shipped.endswith(":") else shipped.rstrip("/") + "/"
        return bool(shipped) and value.startswith(prefix) and "/.." not in value
    return not str(value).startswith("local:")
