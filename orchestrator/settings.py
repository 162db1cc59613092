"""Load deploy.toml plus ``ORCHESTRATOR_*`` environment overrides into a validated Catalog.

All validation happens here, at the edge: whatever is wrong becomes one ConfigError naming where
the value came from (the file, or the environment variable that overrode it), the key path and
the bad value (exit code 2), never a pydantic traceback. Values that look like secrets are never
quoted back.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import time
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator import resources, userfiles
from orchestrator.core.documents import DocumentError, json_document, toml_document
from orchestrator.errors import ConfigError, OrchestratorError
from orchestrator.secrets import redact_values, secret_name, secret_value_kind

if TYPE_CHECKING:  # pydantic and the catalog's models load with the first load(): peek() needs neither
    from pydantic import ValidationError

    from orchestrator.core.catalog import Catalog

DEFAULT_CONFIG = "deploy.toml"
DEFAULT_STATE_DIR = "/var/lib/orchestrator"  # the catalog's default (core/catalog.py)
ENV_PREFIX = "ORCHESTRATOR_"
_file_data: ContextVar[dict[str, Any]] = ContextVar("_file_data")


@functools.cache
def _settings_class() -> type[Catalog]:
    """The catalog, read from the TOML file first and overridden by the environment (built on first use)."""
    from pydantic_settings import (
        BaseSettings,
        InitSettingsSource,
        PydanticBaseSettingsSource,
        SettingsConfigDict,
    )

    from orchestrator.core.catalog import Catalog

    class DeploySettings(Catalog, BaseSettings):
        model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # The file was read and parsed once by load(), for precise errors; the environment wins.
            return (env_settings, InitSettingsSource(settings_cls, _file_data.get()))

    return DeploySettings


def config_path(explicit: str | None = None) -> Path:
    """--config, else $ORCHESTRATOR_CONFIG, else ./deploy.toml."""
    return Path(explicit or os.environ.get("ORCHESTRATOR_CONFIG") or DEFAULT_CONFIG)


class Peek(NamedTuple):
    """What a query through the agent needs of deploy.toml, read without validating the catalog."""

    state_dir: str
    hosts: tuple[str, ...]


def peek(path: str | Path | None = None) -> Peek | None:
    """deploy.toml's ``state_dir`` (``$ORCHESTRATOR_STATE_DIR`` wins) and host names, read as TOML
    only: None when the file or the environment cannot say plainly (missing, not TOML, a value of the
    wrong kind, hosts from the environment), so the caller loads the catalog and gets its exit-2 error."""
    try:
        data = _read_toml(config_path(str(path) if path else None))
    except ConfigError:
        return None
    env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
    state_dir = env.get(f"{ENV_PREFIX}STATE_DIR", data.get("state_dir", DEFAULT_STATE_DIR))
    hosts = data.get("hosts", {})
    if (
        not isinstance(state_dir, str)
        or not state_dir.startswith("/")
        or not isinstance(hosts, dict)
        or any(k.startswith(f"{ENV_PREFIX}HOSTS") for k in env)
    ):
        return None
    return Peek(state_dir, tuple(sorted(hosts)))


def load(path: str | Path | None = None, *, box_files: bool = True) -> Catalog:
    """Read and validate the catalog; raise ConfigError on anything wrong.

    ``box_files`` False: the file is another box's (``--host``): a model's ``config`` path names a file
    there and is kept as written, unread (``shipped:`` ones are read: the package is the same)."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from orchestrator.core import schedule

    file = config_path(str(path) if path else None)
    data = _read_toml(file)
    if not data and not any(k.startswith(f"{ENV_PREFIX}HOSTS") for k in _overrides().values()):
        raise ConfigError(
            "holds no settings (empty, or only comments): a deploy.toml needs at least one "
            "[hosts.NAME] table (the shipped deploy.toml is an example)",
            file=str(file),
        )
    _check_kinds(data, str(file))
    _check_environment()
    token = _file_data.set(data)
    try:
        # A BaseSettings takes its fields from the sources (the file, the environment), not arguments.
        cat = _with_model_configs(_settings_class()(), file, box_files=box_files)  # type: ignore[call-arg]
        if box_files:
            _proxy_accounts(cat, file)
        schedule.first_runs(cat.schedules, time.time())  # a cron whose every fire time has passed
        return cat
    except ValidationError as exc:
        raise _config_error(exc, str(file)) from None
    except SettingsError as exc:
        raise _env_error(str(exc)) from None
    except ConfigError as exc:
        if exc.file is None:
            raise ConfigError(str(exc), file=str(file)) from None
        raise  # already names the file (a model's config.json, the proxy's accounts)
    except OrchestratorError as exc:  # an error raised by a validator outside pydantic's wrap
        raise ConfigError(str(exc), file=str(file)) from None
    finally:
        _file_data.reset(token)


def _proxy_accounts(cat: Catalog, file: Path) -> None:
    """[proxy] user and group name accounts of this machine when it runs a proxy (a local host): HAProxy
    would refuse to start as an account that does not exist, at the first switch instead of now."""
    import grp
    import pwd

    user = cat.proxy.user
    if not cat.proxy.enabled or user is None or not any(h.transport == "local" for h in cat.hosts.values()):
        return
    group_key, group_said = (
        ("proxy.group", "")
        if cat.proxy.group
        else ("proxy.user", " (HAProxy's group: [proxy] group unset takes the user's name)")
    )
    for key, name, kind, look in (
        ("proxy.user", user, "user", pwd.getpwnam),
        (group_key, cat.proxy.group or user, "group", grp.getgrnam),
    ):
        try:
            look(name)
        except KeyError:
            raise ConfigError(
                f"{name!r}: no such {kind} on this machine{'' if kind == 'user' else group_said}: "
                "HAProxy's workers would drop to it (create it, or set another)",
                file=str(file),
                key=key,
            ) from None


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        raw = userfiles.read_bytes(file)
    except FileNotFoundError as exc:
        raise ConfigError("file not found (use --config PATH or ORCHESTRATOR_CONFIG)", file=str(file)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(file)) from exc
    return toml_document(raw, str(file))


def _overrides() -> dict[str, str]:
    """ORCHESTRATOR_* variables that address a setting, by their dotted key path (lower case)."""
    from orchestrator.core.catalog import Catalog

    fields = set(Catalog.model_fields)
    out: dict[str, str] = {}
    for var in os.environ:
        if var.upper().startswith(ENV_PREFIX):
            dotted = var[len(ENV_PREFIX) :].lower().replace("__", ".")
            if dotted.split(".", 1)[0] in fields:
                out[dotted] = var
    return out


# ORCHESTRATOR_* variables the tool reads that are not deploy.toml settings.
OTHER_VARIABLES = frozenset({"CONFIG", "HOST", "HOSTS_FILE", "SOCKET", "LOG_LEVEL", "WHEELHOUSE", "TEST_MODELS"})


def _misspelt() -> None:
    """A variable that is neither a setting nor one of OTHER_VARIABLES but reads like a setting is a
    typo that would silently change nothing (ORCHESTRATOR_STATE_DRI): named, with the setting meant."""
    import difflib

    from orchestrator.core.catalog import Catalog

    fields = list(Catalog.model_fields)
    for var in sorted(os.environ):
        rest = var[len(ENV_PREFIX) :]
        if not var.upper().startswith(ENV_PREFIX) or rest.upper() in OTHER_VARIABLES:
            continue
        head, _, tail = rest.lower().partition("__")
        if head in fields:
            continue
        close = difflib.get_close_matches(head, fields, n=1, cutoff=0.8)
        if close:
            meant = f"{ENV_PREFIX}{close[0].upper()}" + (f"__{tail.upper()}" if tail else "")
            raise ConfigError(
                f"environment variable {var}: not a setting (did you mean {meant}?); "
                f"{ENV_PREFIX}<KEY> overrides a top-level key of deploy.toml, __ separates "
                "the parts of a key path"
            )


def _check_environment() -> None:
    from pydantic_settings import EnvSettingsSource, SettingsError

    _misspelt()
    for var in _overrides().values():
        # pydantic-settings json.loads a table or list given in a variable: bound it the same way as
        # the file (nesting, huge numbers, duplicate keys); what is not JSON at all is left to it.
        value = os.environ[var]
        if value.lstrip().startswith(("[", "{")):
            try:
                json_document(value, f"environment variable {var}")
            except DocumentError as exc:
                if not exc.syntax:
                    raise ConfigError(f"environment variable {var}: {exc.reason}") from None
    try:
        env_data = EnvSettingsSource(_settings_class())()  # type: ignore[arg-type]
    except SettingsError as exc:
        raise _env_error(str(exc)) from None
    _check_kinds(env_data, "", from_env=True)


def _check_kinds(data: dict[str, Any], file: str, *, from_env: bool = False) -> None:
    """A boolean where a number belongs (or a number, or text from the file, where a boolean or a
    number does) is refused naming where it came from, before pydantic would coerce it."""
    from orchestrator.core.catalog import Catalog
    from orchestrator.core.catalog_types import kind_of, wrong_types

    lines = []
    for bad in wrong_types(data, Catalog, text_ok=from_env):
        origin = _origin(bad.key, file)
        if from_env or origin == file:  # a file value an environment variable overrides does not count
            value = str(bad.value).lower() if isinstance(bad.value, bool) else _short(bad.value, bad.key)
            lines.append((origin, f"{bad.key}: must be {bad.expected}, not {kind_of(bad.value)} (got {value})"))
    if lines:
        raise _joined(lines)


def _env_error(message: str) -> ConfigError:
    """A variable pydantic-settings could not decode (JSON for a table or list), named with its value."""
    m = re.search(r'field "([^"]+)"', message)
    field = m.group(1) if m else ""
    var = next((v for k, v in sorted(_overrides().items()) if k == field or k.startswith(field + ".")), None)
    if var is None:
        return ConfigError(f"environment: {message}")
    return ConfigError(
        f"environment variable {var}: {field}: not valid JSON for a table or list (got {_short(os.environ[var], var)})"
    )


def _origin(key: str, file: str) -> str:
    """Where the value at ``key`` came from: the overriding variable, else the file."""
    key = key.lower()
    covering = [(k, v) for k, v in _overrides().items() if key == k or key.startswith((k + ".", k + "["))]
    if covering:
        return f"environment variable {max(covering, key=lambda kv: len(kv[0]))[1]}"
    inside = sorted(v for k, v in _overrides().items() if k.startswith(key + "."))
    return f"{file} (with environment variable {inside[0]})" if inside and key else file


def load_text(text: str, origin: str) -> Catalog:
    """A box's deploy.toml as its agent showed it (``config show``), validated here; errors name ``origin``."""
    with tempfile.TemporaryDirectory(prefix="orchestrator-box-") as tmp:
        path = Path(tmp) / "deploy.toml"
        path.write_text(text)
        try:
            return load(path, box_files=False)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(str(path), origin)) from None


def _with_model_configs(cat: Catalog, file: Path, *, box_files: bool = True) -> Catalog:
    """Resolve each model's ``config`` against the file's directory and check it is a JSON object."""
    resolved = {}
    for name, model in cat.models.items():
        if model.config is None or (not box_files and not model.config.startswith("shipped:")):
            continue
        key = f"models.{name}.config"
        path = _config_path(model.config, file, key)
        try:
            raw = resources.shipped_config(path)
            data = json_document(userfiles.read_bytes(path) if raw is None else raw, str(path), unique_keys=False)
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found", file=str(file), key=key) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}", file=str(file), key=key) from None
        except DocumentError as exc:
            raise ConfigError(f"{path}: not a valid config.json ({exc.reason})", file=str(file), key=key) from None
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path}: not a valid config.json (a JSON {type(data).__name__}, not an object)",
                file=str(file),
                key=key,
            )
        from orchestrator.core.planner_arch import config_field_error, field_message, parse_model

        if (bad := config_field_error(data)) is not None:
            raise ConfigError(f"{path}: {field_message(bad)}", file=str(file), key=key)

        layers = parse_model(data).num_layers
        if layers and model.pipeline_parallel > layers:
            raise ConfigError(
                f"pipeline_parallel {model.pipeline_parallel} is larger than the model's "
                f"{layers} layers (num_hidden_layers in {path}): every stage needs a layer",
                file=str(file),
                key=f"models.{name}.pipeline_parallel",
            )
        resolved[name] = model.model_copy(update={"config": str(path)})
    if not resolved:
        return cat
    return cat.model_copy(update={"models": {**cat.models, **resolved}})


SHIPPED_CONFIGS = resources.SHIPPED_CONFIGS


def _config_path(value: str, file: Path, key: str) -> Path:
    """A model's ``config``: ``shipped:NAME`` (a config.json in the package, the same wherever it is
    installed), else a path, relative to deploy.toml's directory."""
    if value.startswith("shipped:"):
        name = value.removeprefix("shipped:")
        try:
            known = sorted(resources.shipped_configs())
        except OSError as exc:
            raise ConfigError(
                f"{value!r}: cannot read the package's shipped configs: {exc.filename}: {exc.strerror}",
                file=str(file),
                key=key,
            ) from None
        if name not in known:  # a listing, never a path built from the value
            raise ConfigError(
                f"{value!r}: no such shipped config.json (shipped: {', '.join(known)})", file=str(file), key=key
            )
        return SHIPPED_CONFIGS / name
    path = Path(value).expanduser()
    return path if path.is_absolute() else file.parent / path


def _config_error(exc: ValidationError, file: str) -> ConfigError:
    """One message per problem, each with where it came from, its key path and the value found there."""
    lines: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        key = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        ctx_err = (err.get("ctx") or {}).get("error")
        if ctx_err is not None and getattr(ctx_err, "key", None):
            key, msg = ctx_err.key, str(ctx_err).removeprefix(f"{ctx_err.key}: ")
        elif ctx_err is not None and getattr(ctx_err, "sub", None):
            key += ctx_err.sub
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        value = err.get("input")
        quoted = err["type"] == "missing" or isinstance(value, dict) or ctx_err is not None
        lines.append(
            (
                _origin(key, file),
                redact_values(f"{key or '(top level)'}: {msg}" + ("" if quoted else f" (got {_short(value, key)})")),
            )
        )
    return _joined(lines)


def _joined(lines: list[tuple[str, str]]) -> ConfigError:
    """One error for several problems, each ``(origin, "key: what")``: the first, then up to five more."""
    origin, head = lines[0]
    more = "".join(f"\n  also: {'' if o == origin else o + ': '}{line}" for o, line in lines[1:6])
    return ConfigError(redact_values(head + more), file=origin)


def _short(value: Any, key: str = "") -> str:
    if key and secret_name(key.rsplit(".", 1)[-1]):
        return "(a secret by its name, not shown)"
    text = repr(value)
    kind = secret_value_kind(text)
    if kind:
        return f"({kind}, not shown)"
    return text if len(text) <= 80 else text[:77] + "..."
