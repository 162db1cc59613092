"""Files shipped with the package: the Jinja templates (top-level ``templates/``, in the wheel as
``orchestrator/_templates``, a link to it in the source tree, so there is one copy) and the models'
config.json files (``configs/``, named in deploy.toml as ``shipped:NAME``)."""

from __future__ import annotations

import functools
import os
from importlib import resources
from pathlib import Path

from orchestrator.errors import UsageError


def template_text(name: str) -> str:
    """The text of a shipped template, e.g. ``haproxy.cfg.j2``."""
    try:
        return (resources.files("orchestrator") / "_templates" / name).read_text()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(f"template {name!r} is not shipped with this installation of orchestrator") from exc


SHIPPED_CONFIGS = Path(__file__).with_name("configs")


@functools.cache
def shipped_configs() -> dict[str, bytes]:
    """The shipped config.json files by name, read once per process: package data that does not change,
    so a process that can no longer read the package's directory (a child dropped to another user, a
    checkout only root may enter) still has them. OSError (its filename set) when it cannot be read."""
    names = sorted(n for n in os.listdir(SHIPPED_CONFIGS) if n.endswith(".json"))
    return {n: (SHIPPED_CONFIGS / n).read_bytes() for n in names}


def shipped_config(path: str | Path) -> bytes | None:
    """The content of ``path`` when it is a shipped config.json (None: another file)."""
    path = Path(path)
    return shipped_configs().get(path.name) if path.parent == SHIPPED_CONFIGS else None
