"""A file the user may not read, met where no error of ours names it, is still a clear error: exit 2
naming the file, never a bare PermissionError with exit 1 and no message."""

from __future__ import annotations

import pytest

from orchestrator import settings

from .cli_runner import invoke


def test_a_permission_error_with_a_file_is_named_with_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """PermissionError on /srv/x: `error: /srv/x: Permission denied (uid N)`, exit 2."""

    def denied(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied", "/srv/x")

    monkeypatch.setattr(settings, "load", denied)
    result = invoke("models", "--config", "deploy.toml")
    assert result.exit_code == 2 and "error: /srv/x: Permission denied (uid " in result.stderr
