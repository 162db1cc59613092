"""Render a model's systemd unit from its engine's template (``Engine.template``; pure: text in, text out).

All escaping happens in the two filters below, so the template stays a readable layout. systemd
resolves ``%`` specifiers over the whole line, then unquotes words with C escapes, then (ExecStart
only) substitutes ``$VAR``; each filter undoes exactly those steps for one value.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import jinja2

from orchestrator.core.catalog import PATH_RE, USER_RE, Catalog, Host, Model
from orchestrator.core.catalog_rules import is_loopback
from orchestrator.core.safety import check_safe_text
from orchestrator.core.templating import compiled
from orchestrator.engines import Launch
from orchestrator.errors import RenderError


def exec_quote(value: object) -> str:
    """One ExecStart= argument, as a double-quoted word that systemd turns back into ``value``."""
    text = str(value)
    check_safe_text(text, "argument")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def env_quote(key: str, value: object) -> str:
    """One Environment= assignment, quoted as a single word."""
    text = str(value)
    check_safe_text(text, f"value of {key}")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{key}={escaped}"'


def _plain(value: object, what: str) -> str:
    text = str(value)
    check_safe_text(text, what)
    return text.replace("%", "%%")


def _path(value: str, what: str) -> str:
    if not PATH_RE.fullmatch(value):
        raise RenderError(f"{what} {value!r} must be an absolute path without spaces or quotes")
    return value.replace("%", "%%")


@dataclass(frozen=True)
class RenderedUnit:
    name: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


# The address a sleep-enabled engine listens on behind the front proxy: its dev endpoints (/sleep,
# /collective_rpc ...) must not be reachable from outside the box except through the proxy.
LOOPBACK = "127.0.0.1"


def engine_bind(catalog: Catalog, model: Model, host: Host) -> str:
    """Where ``model``'s engine listens on ``host``: loopback for a sleep-enabled engine behind the
    proxy (the catalog refuses one without the proxy unless its bind is loopback already), else the
    host's bind or defaults.bind."""
    bind = host.bind or catalog.defaults.bind
    if model.sleep is not None and catalog.proxy.enabled and not is_loopback(bind):
        return LOOPBACK  # a loopback bind (a test host's own 127.0.0.x) is not exposed either
    return bind


def engine_address(catalog: Catalog, model: Model, host: Host) -> str:
    """Where the proxy and the product's checks reach ``model``'s engine (a UnitSpec's address):
    loopback where it listens only there, else the host's address."""
    bind = engine_bind(catalog, model, host)
    if bind == LOOPBACK or (model.sleep is not None and catalog.proxy.enabled):
        return bind
    return "127.0.0.1" if host.transport == "local" and host.address in ("", "localhost") else host.address


def launch_of(catalog: Catalog, model: Model, model_dir: str, host: Host | None = None) -> Launch:
    """What the engine needs to start ``model`` on ``host`` (default: its own), from the catalog."""
    host = host or catalog.model_host(model.name)
    return Launch(
        command=tuple(catalog.engine_command(host, model)),
        model_dir=model_dir,
        served=model.served,
        bind=engine_bind(catalog, model, host),
        port=model.port,
        tensor_parallel=model.tensor_parallel,
        pipeline_parallel=model.pipeline_parallel,
        data_parallel=model.data_parallel,
        expert_parallel=model.expert_parallel,
        sleep=model.sleep is not None,
        max_model_len=model.max_model_len,
        max_num_seqs=model.max_num_seqs,
        gpu_memory_utilization=model.gpu_memory_utilization or catalog.defaults.gpu_memory_utilization,
        gpus=model.gpus,
        load_deadline_s=load_deadline(catalog, model),
        args=tuple(model.args),
    )


def engine_argv(catalog: Catalog, model: Model, model_dir: str, host: Host | None = None) -> list[str]:
    """The engine's full command line for a model: its command, layout flags, then the model's own args."""
    return model.engine.argv(launch_of(catalog, model, model_dir, host))


def model_dir_for(catalog: Catalog, model: Model, revision: str | None = None, host: Host | None = None) -> str:
    """Where staged weights live on the host (the model's, or ``host``, one node of a multi-node
    model): <models_dir>/<owner>--<repo>/<revision>."""
    if model.source.startswith("local:") and revision is None:
        return model.source.removeprefix("local:")
    host = host or catalog.model_host(model.name)
    # Keyed by repo, not model name: two layouts of the same weights share one download.
    return f"{host.models_dir.rstrip('/')}/{model.repo.replace('/', '--')}/{revision or model.revision}"


def load_deadline(catalog: Catalog, model: Model) -> float:
    return model.load_deadline_s or catalog.defaults.load_deadline_s


def render_unit(
    catalog: Catalog,
    model: Model,
    template: str,
    *,
    model_dir: str | None = None,
    host: Host | None = None,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    unit_name: str | None = None,
    role: str = "",
) -> RenderedUnit:
    """Render ``template`` (the text of the engine's template) for ``model``; a node of a multi-node model
    passes its host, its rank's arguments and environment, and its unit name."""
    d = catalog.defaults
    for value, what in ((d.user, "user"), (d.group, "group")):
        if not USER_RE.fullmatch(value):
            raise RenderError(f"{what} {value!r} is not a valid user or group name")
    directory = model_dir or model_dir_for(catalog, model)
    deadline = load_deadline(catalog, model)
    launch = launch_of(catalog, model, directory, host)
    engine = model.engine
    env = {**engine.environment(launch), **(extra_env or {}), **model.env}
    on = f" ({role} on {host.name})" if host is not None and role else ""
    argv = engine.argv(launch)
    # The model's own args stay last, after the node's (--headless, --node-rank ...).
    argv = argv[: len(argv) - len(model.args)] + list(extra_args) + list(model.args)
    try:
        tmpl = compiled(template)
        text = tmpl.render(
            name=model.name,
            description=_plain(
                f"{engine.title} {model.name}: {model.repo}@{model.revision} on GPUs "
                f"{','.join(map(str, model.gpus))}{on}",
                "description",
            ),
            user=d.user,
            group=d.group,
            environment=[env_quote(k, v) for k, v in env.items()],
            environment_file=_path(f"{d.env_dir.rstrip('/')}/{model.name}.env", "environment file"),
            exec_start=" ".join(exec_quote(a) for a in argv),
            restart_sec=f"{d.restart_sec:g}",
            start_limit_burst=d.start_limit_burst,
            start_limit_interval=int(max(deadline, 60) + d.restart_sec * d.start_limit_burst),
            timeout_start=int(deadline),
            timeout_stop=int(d.stop_timeout_s),
        )
    except jinja2.TemplateError as exc:
        raise RenderError(f"template {engine.template}: {exc}") from exc
    return RenderedUnit(name=unit_name or model.unit_name, text=text)


def render_agent_unit(
    catalog: Catalog, template: str, *, python: str, config: str, extra_env: dict[str, str] | None = None
) -> RenderedUnit:
    """The agent's own unit (Type=notify, watchdog), running ``python -m orchestrator agent``."""
    # Each word is quoted for ExecStart=: a venv of a checkout in "/srv/my tools/é x" runs as it is.
    if not python.startswith("/") or not config.startswith("/"):
        raise RenderError(f"the agent's python {python!r} and config {config!r} must be absolute paths")
    argv = [python, "-m", "orchestrator", "agent", "--config", config]
    try:
        text = compiled(template).render(
            hosts=_plain(", ".join(sorted(catalog.hosts)), "hosts"),
            exec_start=" ".join(exec_quote(a) for a in argv),
            environment=[env_quote(k, v) for k, v in (extra_env or {}).items()],
        )
    except jinja2.TemplateError as exc:
        raise RenderError(f"template orchestrator-agent.service.j2: {exc}") from exc
    return RenderedUnit(name="orchestrator-agent.service", text=text)
