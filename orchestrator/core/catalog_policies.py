"""How deploy.toml's models are run, as validated data: schedules, the policy of
switches and the watch, fleet groups, the front proxy, models on demand."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.core.catalog_rules import (
    DAY,
    Name,
    Strict,
    SubKeyError,
    absolute_path,
    check_address,
    check_cron,
    parse_window,
    parse_zone,
    safe,
    socket_file,
    socket_fits,
    under,
)

MAX_GROUP_HOSTS = 10_000  # the CLI's bound on hosts of a group (cli/options.MAX_HOSTS)


class Schedule(Strict):
    """A cron-driven operation: switch to a model, or redeploy what runs."""

    name: Name = ""
    cron: str
    host: Name | None = None
    action: Literal["switch", "redeploy", "stage"] = "switch"
    model: Name | None = None
    window: str | None = None
    # A schedule that comes due while the host is busy is skipped and recorded (the only choice:
    # a queued switch could fire hours late, outside its window).
    on_busy: Literal["skip"] = "skip"
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _cron(cls, v: str) -> str:
        return check_cron(v)

    @field_validator("window")
    @classmethod
    def _window(cls, v: str | None) -> str | None:
        if v is not None:
            parse_window(v)
        return v

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        parse_zone(v)
        return v

    @model_validator(mode="after")
    def _model_needed(self) -> Schedule:
        if self.action in ("switch", "stage") and not self.model:
            raise ValueError(f"action {self.action!r} needs a model")
        return self


class Policy(Strict):
    """What the agent does on its own."""

    rollback_on_failure: bool = True
    watch_interval_s: float = Field(15.0, ge=0.01, le=DAY)
    unhealthy_after_s: float = Field(60.0, gt=0, le=7 * DAY)
    on_unhealthy: Literal["restart", "rollback", "record"] = "restart"
    smoke_bench: bool = False
    min_tok_s_ratio: float | None = Field(None, gt=0, le=1)
    keep_revisions: int = Field(2, ge=1, le=1000)


class Group(Strict):
    """Hosts that run the same models, one replica each, and how a rollout moves across them.

    The vocabulary is Nomad's and Ansible's: ``canary`` hosts switch first and alone, then ``batch``
    hosts at a time; more than ``max_failures`` failed hosts stop the rollout. ``gate`` is checked
    on every switched host before the next batch starts."""

    name: Name = ""
    hosts: tuple[Name, ...]
    canary: int = Field(1, ge=0, le=MAX_GROUP_HOSTS)
    batch: int = Field(1, ge=1, le=MAX_GROUP_HOSTS)
    max_failures: int = Field(0, ge=0, le=MAX_GROUP_HOSTS)
    gate: Literal["none", "health", "bench"] = "health"
    seed: Name | None = None  # the one host that downloads from the hub; the others copy from a peer
    peer_key: str | None = None  # on every box: the key its rsync uses to reach a peer box
    peer_known_hosts: str | None = None  # on every box: the peers' host keys

    @field_validator("peer_key", "peer_known_hosts")
    @classmethod
    def _safe_paths(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r} is not an absolute path (a path on every box of the group)")
        return None if v is None else absolute_path(safe(v, "value"), "path")

    @model_validator(mode="after")
    def _canary_fits(self) -> Group:
        # The rollout's own rule (core.rollout.plan): a canary must leave hosts to promote to.
        n = len(self.hosts)
        if self.max_failures > n:
            raise SubKeyError(
                ".max_failures",
                f"max_failures {self.max_failures} is more than the group's {n} hosts "
                f"({', '.join(self.hosts)}): no rollout could ever fail that many; "
                f"use at most {n}",
            )
        if self.canary > n or (self.canary == n and n > 1):
            raise SubKeyError(
                ".canary",
                f"canary {self.canary} is {'larger than' if self.canary > n else 'all of'} "
                f"the group's {n} hosts ({', '.join(self.hosts)}): nothing would be left to "
                f"promote; use at most {max(n - 1, 1)}",
            )
        return self

    @field_validator("hosts")
    @classmethod
    def _hosts_listed_once(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a group needs at least one host")
        twice = sorted({h for h in v if v.count(h) > 1})
        if twice:
            raise ValueError(f"host {twice[0]!r} is listed more than once")
        return v


class Proxy(Strict):
    """The front proxy (HAProxy) on every host: one endpoint that routes by the request's model."""

    enabled: bool = False
    port: int = Field(8000, ge=1, le=65535)
    bind: str | None = None  # the address it listens on; the host's bind (or defaults.bind) when unset
    stats_socket: str = Field("/run/orchestrator-proxy/admin.sock", pattern=r"^/[A-Za-z0-9._/-]+$")
    config_path: str = Field("/etc/orchestrator/haproxy.cfg", pattern=r"^/[A-Za-z0-9._/-]+$")
    haproxy: str = Field("/usr/sbin/haproxy", pattern=r"^/[A-Za-z0-9._/-]+$")
    drain_timeout_s: float = Field(30.0, gt=0, le=3600)
    # A warm switch moves its route once the engines it displaces have no request in flight (so none
    # holds their sleep), waiting at most this long (deploy/actions.await_quiet); 0: at once.
    quiet_wait_s: float = Field(2.0, ge=0, le=60)
    retry_after_s: int = Field(5, ge=1, le=3600)
    # Models on demand: the agent's Unix socket the proxy asks for a held request's model (unset:
    # /run/orchestrator/demand.sock, its directory open to HAProxy's group; Catalog.demand_socket).
    demand_socket: str | None = None
    # The account HAProxy's workers drop to (`user` / `group` in its global section, as Debian's stock
    # config has; unset: they stay root). The agent checks it can reach the demand socket.
    user: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    group: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")  # default: the user's name

    @field_validator("bind")
    @classmethod
    def _safe_bind(cls, v: str | None) -> str | None:
        return None if v is None else check_address(v, "bind")

    @field_validator("config_path")
    @classmethod
    def _config_in_etc(cls, v: str) -> str:
        return under(v, "/etc/orchestrator/", ".cfg", "config_path")

    @field_validator("stats_socket")
    @classmethod
    def _socket_in_run(cls, v: str) -> str:
        if v.rsplit("/", 1)[-1] == "master.sock":
            raise ValueError(f"stats_socket {v!r} is the name of HAProxy's master socket beside it: use another")
        return socket_fits(under(v, "/run/orchestrator-proxy/", ".sock", "stats_socket"), "stats_socket")

    @field_validator("demand_socket")
    @classmethod
    def _socket_path(cls, v: str | None) -> str | None:
        return None if v is None else socket_file(v, "demand_socket")

    @model_validator(mode="after")
    def _group_with_user(self) -> Proxy:
        if self.group is not None and self.user is None:
            raise SubKeyError(
                ".group",
                f"group {self.group!r} without user: HAProxy drops to a group only with a user; set [proxy] user too",
            )
        return self

    @property
    def master_socket(self) -> str:
        """HAProxy's master CLI socket, beside the stats socket."""
        return self.stats_socket.rsplit("/", 1)[0] + "/master.sock"

    @property
    def run_group(self) -> str | None:
        """The group HAProxy's workers run as (None: root's)."""
        return self.group or self.user

    @field_validator("haproxy")
    @classmethod
    def _plain_executable(cls, v: str) -> str:
        if any(p in ("..", ".") for p in v.split("/")):
            raise ValueError(f"haproxy {v!r} has a '..' or '.' part: name the executable's real path")
        return v


class Demand(Strict):
    """Models on demand, box-wide: how often the agent may swap models for requests, and how long the
    next model's requests are batched while the awake one still has requests."""

    max_swaps_per_min: int = Field(6, ge=1, le=600)
    batch_wait_s: float = Field(2.0, ge=0, le=600)
