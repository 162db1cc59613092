"""Files shipped with the package: the Jinja templates (top-level ``templates/``, in the wheel as
``orchestrator/_templates``, a link to it in the source tree, so there is one copy)."""

from __future__ import annotations

from importlib import resources

from orchestrator.errors import UsageError


def template_text(name: str) -> str:
    """The text of a shipped template, e.g. ``vllm.service.j2``."""
    try:
        return (resources.files("orchestrator") / "_templates" / name).read_text()
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise UsageError(f"template {name!r} is not shipped with this installation of orchestrator") from exc
