"""Load deploy.toml plus ``ORCHESTRATOR_*`` environment overrides into a validated Catalog.

All validation happens here, at the edge: whatever is wrong becomes one ConfigError naming the
file, the key path and the bad value (exit code 2), never a pydantic traceback.
"""

from __future__ import annotations

import json
import os
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from orchestrator.core.catalog import Catalog
from orchestrator.errors import ConfigError, OrchestratorError

DEFAULT_CONFIG = "deploy.toml"
_toml_path: ContextVar[Path] = ContextVar("_toml_path")


class DeploySettings(Catalog, BaseSettings):
    """The catalog, read from the TOML file first and overridden by the environment."""

    model_config = SettingsConfigDict(env_prefix="ORCHESTRATOR_", env_nested_delimiter="__",
                                      extra="forbid", frozen=True)

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, _toml_path.get()))


def config_path(explicit: str | None = None) -> Path:
    """--config, else $ORCHESTRATOR_CONFIG, else ./deploy.toml."""
    return Path(explicit or os.environ.get("ORCHESTRATOR_CONFIG") or DEFAULT_CONFIG)


def load(path: str | Path | None = None) -> Catalog:
    """Read and validate the catalog; raise ConfigError on anything wrong."""
    file = config_path(str(path) if path else None)
    try:
        with file.open("rb") as fh:
            tomllib.load(fh)  # parse once here for a precise syntax error with line and column
    except FileNotFoundError as exc:
        raise ConfigError("file not found (use --config PATH or ORCHESTRATOR_CONFIG)", file=str(file)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=str(file)) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(file)) from exc
    token = _toml_path.set(file)
    try:
        return _with_model_configs(DeploySettings(), file)
    except ValidationError as exc:
        raise _config_error(exc, str(file)) from None
    except OrchestratorError as exc:  # a RenderError raised by a field validator outside pydantic's wrap
        raise ConfigError(str(exc), file=str(file)) from None
    finally:
        _toml_path.reset(token)


def _with_model_configs(cat: Catalog, file: Path) -> Catalog:
    """Resolve each model's ``config`` against the file's directory and check it is a JSON object."""
    resolved = {}
    for name, model in cat.models.items():
        if model.config is None:
            continue
        path = Path(model.config).expanduser()
        path = path if path.is_absolute() else file.parent / path
        key = f"models.{name}.config"
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found", file=str(file), key=key) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}", file=str(file), key=key) from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not a valid config.json (not JSON: {exc})", file=str(file),
                              key=key) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: not a valid config.json (a JSON {type(data).__name__}, not an object)",
                              file=str(file), key=key)
        resolved[name] = model.model_copy(update={"config": str(path)})
    if not resolved:
        return cat
    return cat.model_copy(update={"models": {**cat.models, **resolved}})


def _config_error(exc: ValidationError, file: str) -> ConfigError:
    """One message per problem, each with its key path and the value found there."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        key = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        ctx_err = (err.get("ctx") or {}).get("error")
        if ctx_err is not None and getattr(ctx_err, "key", None):
            key, msg = ctx_err.key, str(ctx_err).removeprefix(f"{ctx_err.key}: ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        value = err.get("input")
        shown = "" if err["type"] in ("missing",) or isinstance(value, dict) else f" (got {_short(value)})"
        lines.append(f"{key or '(top level)'}: {msg}{shown}")
    head = lines[0]
    more = "".join(f"\n  also: {line}" for line in lines[1:6])
    return ConfigError(head + more, file=file)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
