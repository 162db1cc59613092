"""The catalog: the whole deploy.toml, cross-checked (a schedule naming an unknown model, two models
on one port, a group naming an unknown host). Its entries and their field-level rules are in
``core.catalog_hosts``, ``catalog_models``, ``catalog_policies`` and ``catalog_rules``; loading the
file and the environment is ``orchestrator.settings``' job.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, field_validator, model_validator

from orchestrator.core.catalog_hosts import Defaults, Host
from orchestrator.core.catalog_models import Model
from orchestrator.core.catalog_policies import Demand, Group, Policy, Proxy, Schedule
from orchestrator.core.catalog_rules import (
    NAME_RE,
    PATH_RE,
    ROUTABLE_RE,
    SECRET_ADVICE,
    USER_RE,
    Name,
    Strict,
    SubKeyError,
    absolute_path,
    check_revision,
    is_loopback,
    safe,
    socket_fits,
)
from orchestrator.core.dashboard import Dashboard, socket_path
from orchestrator.core.safety import shown
from orchestrator.engines import ENGINE
from orchestrator.errors import UsageError
from orchestrator.secrets import scan

# Models on demand: where the agent listens for the proxy when [proxy] demand_socket is unset.
DEFAULT_DEMAND_SOCKET = "/run/orchestrator/demand.sock"
# The longest of the sockets the agent makes in state_dir (agent.sock, demand.sock, dashboard.sock).
LONGEST_SOCKET = "dashboard.sock"

__all__ = [
    "NAME_RE",
    "PATH_RE",
    "USER_RE",
    "Catalog",
    "Defaults",
    "Demand",
    "Group",
    "Host",
    "Model",
    "Policy",
    "Proxy",
    "Schedule",
    "SubKeyError",
    "check_revision",
]


class Catalog(Strict):
    """The whole deploy.toml, cross-checked."""

    state_dir: str = "/var/lib/orchestrator"
    socket_group: str = "orchestrator"
    metrics_port: int = Field(9464, ge=0, le=65535)  # Prometheus on 127.0.0.1; 0 turns it off
    defaults: Defaults = Field(default_factory=Defaults)
    policy: Policy = Field(default_factory=Policy)
    proxy: Proxy = Field(default_factory=Proxy)
    demand: Demand = Field(default_factory=Demand)
    dashboard: Dashboard = Field(default_factory=Dashboard)
    hosts: dict[Name, Host]
    models: dict[Name, Model] = Field(default_factory=dict)
    schedules: dict[Name, Schedule] = Field(default_factory=dict)
    groups: dict[Name, Group] = Field(default_factory=dict)

    @field_validator("state_dir")
    @classmethod
    def _state_dir_absolute(cls, v: str) -> str:
        # Its sockets (agent.sock, demand.sock, dashboard.sock) must fit a socket path.
        socket_fits(
            f"{safe(absolute_path(v, 'state_dir'), 'state_dir').rstrip('/')}/{LONGEST_SOCKET}",
            f"state_dir's {LONGEST_SOCKET}",
        )
        return v

    @field_validator("socket_group")
    @classmethod
    def _group_name(cls, v: str) -> str:
        # groupadd, install -g and chown take it as an argument: never an option or two words.
        if not USER_RE.fullmatch(v):
            raise ValueError(
                f"{shown(v)} is not a valid group name (lower case letters, digits, '_', '-'; "
                "at most 32, not starting with '-' or a digit)"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _names_from_keys(cls, data: object) -> object:
        # deploy.toml names tables by key ([models.minimax-m25]); copy the key into each entry.
        if isinstance(data, dict):
            for section in ("hosts", "models", "schedules", "groups"):
                table = data.get(section)
                if isinstance(table, dict):
                    data[section] = {k: ({**v, "name": k} if isinstance(v, dict) else v) for k, v in table.items()}
        return data

    @model_validator(mode="after")
    def _no_inline_secret(self) -> Catalog:
        found = scan(self.model_dump())
        if found:
            path, what = found
            raise _KeyedError(path, f"holds {what} (value not shown): {SECRET_ADVICE}")
        return self

    @model_validator(mode="after")
    def _groups_known(self) -> Catalog:
        for name, group in self.groups.items():
            unknown = [h for h in group.hosts if h not in self.hosts]
            if unknown:
                raise _KeyedError(
                    f"groups.{name}.hosts", f"unknown host {unknown[0]!r} (known: {', '.join(sorted(self.hosts))})"
                )
            if group.seed is not None and group.seed not in group.hosts:
                raise _KeyedError(
                    f"groups.{name}.seed", f"seed {group.seed!r} is not a host of the group ({', '.join(group.hosts)})"
                )
        for name, model in self.models.items():
            if model.group is not None and model.group not in self.groups:
                known = ", ".join(sorted(self.groups)) or "none"
                raise _KeyedError(f"models.{name}.group", f"unknown group {model.group!r} (known: {known})")
        return self

    @model_validator(mode="after")
    def _cross_references(self) -> Catalog:
        for name, model in self.models.items():
            for node in model.nodes:
                if node not in self.hosts:
                    raise _KeyedError(
                        f"models.{name}.nodes", f"unknown host {node!r} (known: {', '.join(sorted(self.hosts))})"
                    )
            for host in self.model_hosts(name):
                too_high = [g for g in model.gpus if g >= host.gpus]
                if too_high:
                    raise _KeyedError(
                        f"models.{name}.gpus",
                        f"GPU index {too_high[0]} is out of range: host {host.name} has "
                        + (
                            f"{host.gpus} GPUs (0-{host.gpus - 1})"
                            if host.gpus
                            else f"no GPUs (hosts.{host.name}.gpus = 0)"
                        ),
                    )
                if model.nodes and model.tensor_parallel > host.gpus:
                    raise _KeyedError(
                        f"models.{name}.tensor_parallel",
                        f"tensor_parallel {model.tensor_parallel} is larger than node "
                        f"{host.name}'s {host.gpus} GPUs: keep TP inside a box and use "
                        "pipeline_parallel or data_parallel across nodes",
                    )
        if self.proxy.enabled:
            self._check_routable()
        for name, sched in self.schedules.items():
            if sched.model and sched.model not in self.models:
                raise _KeyedError(f"schedules.{name}.model", unknown_model(sched.model, self.models))
            if sched.host and sched.host not in self.hosts:
                raise _KeyedError(
                    f"schedules.{name}.host", f"unknown host {sched.host!r} (known: {', '.join(sorted(self.hosts))})"
                )
        return self

    @model_validator(mode="after")
    def _ports_distinct(self) -> Catalog:
        """Every port a box listens on, of every kind, once per host: engine ports, each multi-node
        model's rendezvous (master_port) or Ray GCS (ray_port) on its head, the agent's metrics_port
        and the front proxy's port. Two models that share a GPU never run at once, so only their
        rendezvous ports may coincide; an engine port is the model's route and stays unique."""
        claims: dict[tuple[str, int], tuple[str, str, frozenset[int] | None]] = {}  # -> (what, key, gpus)
        always: list[tuple[int, str, str]] = []
        if self.metrics_port:
            always.append((self.metrics_port, "the agent's metrics port", "metrics_port"))
        if self.proxy.enabled:
            always.append((self.proxy.port, "the front proxy's port", "proxy.port"))
        if len({port for port, _, _ in always}) < len(always):
            raise _KeyedError(
                "metrics_port",
                f"port {self.metrics_port} is also the front proxy's port (proxy.port): "
                "give each listener a port of its own",
            )
        for host_name in self.hosts:
            for port, what, key in always:
                claims.setdefault((host_name, port), (what, key, None))
        for name, model in self.models.items():
            own: list[tuple[list[Host], int, str]] = [(self.model_hosts(name), model.port, "port")]
            if model.nodes:
                kind = "ray_port" if model.backend == "ray" else "master_port"
                own.append((self.nodes_of(name)[:1], getattr(model, kind), kind))
            for hosts, port, field in own:
                for node in hosts:
                    at = (node.name, port)
                    owner = f"model {name}" + ("" if field == "port" else f"'s {field}")
                    here = (f"already used by {owner}", f"models.{name}.{field}", frozenset(model.gpus))
                    prior = claims.get(at)
                    if prior is not None and _collide(prior, here, field):
                        raise _KeyedError(
                            here[1],
                            f"port {port} is {prior[0]} on host {node.name} ({prior[1]}): "
                            "give each listener a port of its own",
                        )
                    claims.setdefault(at, here)
        return self

    @model_validator(mode="after")
    def _peer_sources(self) -> Catalog:
        """``source = "host:NAME"``: a peer copy needs another known host and a pinned revision (the
        peer's directory is named by the commit)."""
        for name, model in self.models.items():
            if not model.source.startswith("host:"):
                continue
            peer, key = model.source.removeprefix("host:"), f"models.{name}.source"
            if peer not in self.hosts:
                raise _KeyedError(
                    key, f"source {model.source!r} names unknown host {peer!r} (known: {', '.join(sorted(self.hosts))})"
                )
            if model.group is not None:
                raise _KeyedError(
                    key,
                    f"source {model.source!r}: a group model's weights come from the hub "
                    "once per rollout (the seed host pulls, the others copy from a peer)",
                )
            if peer == self.model_host(name).name:
                raise _KeyedError(
                    key,
                    f'source {model.source!r} is the model\'s own host {peer!r}; copy from another host, or use "hub"',
                )
            if not model.pinned:
                raise _KeyedError(
                    key,
                    f"source {model.source!r} needs revision pinned to a commit SHA (got revision {model.revision!r})",
                )
        return self

    @model_validator(mode="after")
    def _sleep_possible(self) -> Catalog:
        """`sleep`: a GPU platform with the engine's sleep mode, one box, room in host RAM for a level1
        sleeper, and the dev endpoints sleep mode opens never reachable except through the proxy."""
        for name, model in self.models.items():
            if model.sleep is None:
                continue
            key, said = f"models.{name}.sleep", f"sleep {model.sleep!r}"
            if model.nodes:
                raise _KeyedError(
                    key,
                    f"{said}: a multi-node model ({', '.join(model.nodes)}) cannot sleep; "
                    "warm switches are for models on one box",
                )
            for host in self.model_hosts(name):
                platform = self.platform_of(host, model)
                title = model.engine.title
                if platform == "cpu":
                    why = (
                        f'hosts.{host.name}.platform = "cpu"'
                        if host.platform
                        else f"its engine {self.engine_command(host, model)[0]} is {title}'s CPU build"
                    )
                    raise _KeyedError(
                        key,
                        f"{said}: host {host.name} cannot sleep ({why}): {title}'s "
                        "CPU build has no sleep mode; remove sleep or use a GPU host",
                    )
                if host.sleep_residue_gib >= host.gpu_memory_gib:
                    raise _KeyedError(
                        f"hosts.{host.name}.sleep_residue_gib",
                        f"sleep_residue_gib {host.sleep_residue_gib:g} (what a sleeping engine keeps "
                        f"per GPU) is not less than gpu_memory_gib {host.gpu_memory_gib:g}: "
                        f"{key} = {model.sleep!r} could never leave room for another engine",
                    )
                budget = host.sleep_ram_budget()
                if model.sleep == "level1" and budget is not None and budget <= 0:
                    which = "sleep_ram_gib" if host.sleep_ram_gib is not None else "memory_gib"
                    value = host.sleep_ram_gib if host.sleep_ram_gib is not None else host.memory_gib
                    raise _KeyedError(
                        f"hosts.{host.name}.{which}",
                        f"{which} {value:g} leaves a RAM budget of 0 GiB for sleeping weights: "
                        f'it cannot hold one level1 sleeper ({key} = "level1"); raise it, '
                        'or use sleep = "level2" (weights dropped, reloaded on wake)',
                    )
                bind, bind_key = (
                    (host.bind, f"hosts.{host.name}.bind") if host.bind else (self.defaults.bind, "defaults.bind")
                )
                if not self.proxy.enabled and not is_loopback(bind):
                    raise _KeyedError(
                        key,
                        f"{said} opens {title}'s dev endpoints (/sleep, /wake_up, "
                        f"/collective_rpc ...) on the engine's port, and {bind_key} = "
                        f"{bind!r} would expose them beyond the box: set [proxy] enabled = "
                        "true (the engine then listens on 127.0.0.1 behind it, which never "
                        f'forwards those paths) or {bind_key} = "127.0.0.1"',
                    )
        return self

    @model_validator(mode="after")
    def _demand_possible(self) -> Catalog:
        """Models on demand: held by the front proxy, on one box, and idle sleep only with sleep mode;
        the idle and priority keys mean nothing without on_demand."""
        for name, model in self.models.items():
            key = f"models.{name}"
            if not model.on_demand:
                # A value at its default says nothing (a model read back from its own dump sets them all).
                extra = sorted(
                    k
                    for k in _DEMAND_KEYS
                    if k in model.model_fields_set and getattr(model, k) != type(model).model_fields[k].default
                )
                if extra:
                    raise _KeyedError(
                        f"{key}.{extra[0]}",
                        f"{extra[0]} = {getattr(model, extra[0])!r} applies to "
                        "models on demand: set on_demand = true as well",
                    )
                continue
            if model.nodes:
                raise _KeyedError(
                    f"{key}.on_demand",
                    "on_demand = true: a multi-node model "
                    f"({', '.join(model.nodes)}) cannot be started on demand; "
                    "models on demand run on one box",
                )
            if model.group is not None:
                raise _KeyedError(
                    f"{key}.on_demand",
                    f"on_demand = true: a fleet model (group {model.group!r}) is "
                    "switched by `rollout`, not by requests",
                )
            if not self.proxy.enabled:
                raise _KeyedError(
                    f"{key}.on_demand",
                    "on_demand = true needs [proxy] enabled = true: the front proxy "
                    "holds a request while the agent wakes or starts its model",
                )
            twin = next(
                (
                    other
                    for other, m in self.models.items()
                    if other != name
                    and m.served == model.served
                    and {h.name for h in self.model_hosts(other)} & {h.name for h in self.model_hosts(name)}
                ),
                None,
            )
            if twin is not None:
                raise _KeyedError(
                    f"{key}.on_demand",
                    f"on_demand = true: model {twin} serves the same name "
                    f"{model.served!r} on the same host, so a request for it "
                    "could not say which to bring up; give each its own "
                    "served_name",
                )
            if model.idle_sleep_s is not None and model.sleep is None:
                raise _KeyedError(
                    f"{key}.idle_sleep_s",
                    f"idle_sleep_s = {model.idle_sleep_s:g} on a model without "
                    'sleep mode: set sleep = "level1" or "level2", or use '
                    "idle_stop_s (the engine is stopped)",
                )
        return self

    @model_validator(mode="after")
    def _sockets_distinct(self) -> Catalog:
        """Each socket the agent and HAProxy bind has a path of its own: a second bind at one would fail,
        or take the other's place (the dashboard at the agent's own agent.sock)."""
        state = self.state_dir.rstrip("/")
        sockets = [
            (f"{state}/agent.sock", "the agent's socket (state_dir)"),
            (self.proxy.stats_socket, "proxy.stats_socket"),
            (self.proxy.master_socket, "HAProxy's master socket (beside proxy.stats_socket)"),
            (
                self.demand_socket(),
                "proxy.demand_socket"
                if self.proxy.demand_socket
                else f"the default demand socket {DEFAULT_DEMAND_SOCKET}",
            ),
            (
                socket_path(self.dashboard, state),
                "dashboard.socket" if self.dashboard.socket else "the dashboard's socket (state_dir)",
            ),
        ]
        keys = {"proxy.demand_socket": self.proxy.demand_socket, "dashboard.socket": self.dashboard.socket}
        seen: dict[str, str] = {}
        for path, what in sockets:
            if path in seen:
                key = what if what in keys else seen[path] if seen[path] in keys else "state_dir"
                other = seen[path] if key == what else what
                raise _KeyedError(key, f"{path!r} is also {other}: give each socket a path of its own")
            seen[path] = what
        return self

    def demand_socket(self) -> str:
        """Where the agent listens for the proxy's held requests: [proxy] demand_socket, else
        /run/orchestrator/demand.sock (not in state_dir: HAProxy's workers, when they drop to their
        own user, must reach it, and state_dir is 0750 for the socket group)."""
        return self.proxy.demand_socket or DEFAULT_DEMAND_SOCKET

    def demand_deadline(self, name: str, *, cold: bool) -> float:
        """How long a request for on-demand model ``name`` is held before a 503: its demand_deadline_s,
        else the wake deadline (asleep) or the load deadline (``cold``: stopped), plus batch_wait_s."""
        model = self.model(name)
        if model.demand_deadline_s is not None:
            return model.demand_deadline_s
        base = (
            (model.load_deadline_s or self.defaults.load_deadline_s)
            if cold or model.sleep is None
            else (model.wake_deadline_s or self.defaults.wake_deadline_s)
        )
        return base + self.demand.batch_wait_s

    def platform_of(self, host: Host, model: Model | None = None) -> str:
        """What ``model``'s engine (default: the default engine) runs on at ``host``: its `platform`, else
        what the engine tells from its command line (its CPU build: "cpu"), else "cuda"."""
        if host.platform is not None:
            return host.platform
        engine = ENGINE if model is None else model.engine
        return engine.platform(self.engine_command(host, model))

    def model(self, name: str) -> Model:
        """The model called ``name``, or the one UsageError that lists the known ones."""
        if name not in self.models:
            raise UsageError(unknown_model(name, self.models))
        return self.models[name]

    def host(self, name: str) -> Host:
        """The host called ``name``, or the one UsageError that lists the known ones."""
        if name not in self.hosts:
            raise UsageError(f"unknown host {name!r} (known: {', '.join(sorted(self.hosts)) or 'none'})")
        return self.hosts[name]

    def only_host(self) -> Host:
        """The single host, for commands that may leave --on out; else a UsageError naming them."""
        if len(self.hosts) != 1:
            raise UsageError(
                f"there are {len(self.hosts)} hosts: say which one with --on ({', '.join(sorted(self.hosts))})"
            )
        return next(iter(self.hosts.values()))

    def target(self, model: str | None = None, host: str | None = None) -> Host:
        """The one way from a request's names to the Host it acts on: the named host, else the model's
        host, else the only host (the UsageError of ``host``, ``model_host`` or ``only_host`` otherwise)."""
        if host is not None:
            return self.host(host)
        return self.model_host(model) if model is not None else self.only_host()

    def model_hosts(self, model: str) -> list[Host]:
        """Every host a model runs on: its group's hosts (one replica each), its nodes (one engine
        across them, the API's first), else its one host."""
        spec = self.model(model)
        if spec.group is not None:
            return [self.hosts[h] for h in self.groups[spec.group].hosts]
        return self.nodes_of(model)

    def _check_routable(self) -> None:
        """With the proxy on, every served name must be routable and no model may take its port."""
        for name, model in self.models.items():
            if not ROUTABLE_RE.fullmatch(model.served):
                raise _KeyedError(
                    f"models.{name}.served_name",
                    f"{model.served!r} cannot be routed by the front proxy: use letters, "
                    f"digits and . _ : / @ + - (no spaces or quotes), at most 128",
                )

    def model_host(self, model: str) -> Host:
        """The host a model runs on (a multi-node model: its first node, which serves the API): where a
        model's name turns into its Host, so an unknown one is the UsageError of ``model``."""
        spec = self.model(model)
        if spec.nodes and spec.nodes[0] in self.hosts:
            return self.hosts[spec.nodes[0]]
        if spec.group is not None:
            raise UsageError(
                f"model {model!r} runs on every host of group {spec.group!r} "
                f"({', '.join(self.groups[spec.group].hosts)}): switch it with "
                f"`orchestrator rollout {model}`"
            )
        if spec.host is not None:
            if spec.host not in self.hosts:
                raise _KeyedError(
                    f"models.{model}.host", f"unknown host {spec.host!r} (known: {', '.join(sorted(self.hosts))})"
                )
            return self.hosts[spec.host]
        if len(self.hosts) != 1:
            raise _KeyedError(
                f"models.{model}.host", f"missing: there are {len(self.hosts)} hosts, say which one serves it"
            )
        return next(iter(self.hosts.values()))

    def nodes_of(self, model: str) -> list[Host]:
        """Every host a model runs on, the API's first."""
        spec = self.model(model)
        if spec.nodes:
            return [self.hosts[n] for n in spec.nodes if n in self.hosts]
        return [self.model_host(model)]

    def models_on(self, host: str) -> list[str]:
        return [m for m in self.models if host in (h.name for h in self.model_hosts(m))]

    def engine_command(self, host: Host, model: Model | None = None) -> tuple[str, ...]:
        """The command line of ``model``'s engine on ``host``: deploy.toml's `engine` (the host's, else
        [defaults]), which is the default engine's; a model on another engine (its `engine_name`) runs
        that engine's default command."""
        if model is not None and model.engine_name != ENGINE.name:
            return model.engine.default_command
        return host.engine or self.defaults.engine


_DEMAND_KEYS = ("idle_sleep_s", "idle_stop_s", "min_awake_s", "priority", "queue_limit", "demand_deadline_s")


def unknown_model(name: str, models: Mapping[str, object]) -> str:
    """The one wording of a model name the catalog does not know, listing the known ones."""
    return f"unknown model {name!r} (known: {', '.join(sorted(models)) or 'none'})"


def _collide(
    prior: tuple[str, str, frozenset[int] | None], here: tuple[str, str, frozenset[int] | None], field: str
) -> bool:
    """Whether two claims on one host's port can be live at once."""
    if prior[2] is None or here[2] is None or prior[1].rsplit(".", 1)[0] == here[1].rsplit(".", 1)[0]:
        return True  # an always-on listener, or one model's own two ports
    if field == "port" and prior[1].endswith(".port"):
        return True  # engine ports: unique per host whatever the GPUs (the route names the port)
    return not (prior[2] & here[2])


class _KeyedError(ValueError):
    """A cross-reference error that knows its key path (pydantic would only say 'value_error')."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
