"""The CLI under a hostile new user's inputs: empty paths, bad --json consumers, --host URLs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.cli_runner import invoke

GOOD = '[hosts.box]\ngpus = 8\n[models.a]\nrepo = "org/a"\ngpus = [0]\n'


@pytest.mark.parametrize("args,option", [
    (["models", "--config", ""], "--config"),
    (["plan", "a", "--config", ""], "--config"),
    (["render", "--out", ""], "--out"),
    (["plan", "a", "--model-config", ""], "--model-config"),
])
def test_an_empty_path_option_is_refused_not_defaulted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      args: list[str], option: str) -> None:
    """`--config "$UNSET"` never reads ./deploy.toml, `--out ""` never writes into the working directory."""
    (tmp_path / "deploy.toml").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}': an empty path" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.toml"]
