"""The CLI under a hostile new user's inputs: empty paths, bad --json consumers, --host URLs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import Busy
from tests.unit.cli_runner import invoke

GOOD = '[hosts.box]\ngpus = 8\n[models.a]\nrepo = "org/a"\ngpus = [0]\n'


@pytest.mark.parametrize(
    "args,option",
    [
        (["models", "--config", ""], "--config"),
        (["plan", "a", "--config", ""], "--config"),
        (["render", "--out", ""], "--out"),
        (["plan", "a", "--model-config", ""], "--model-config"),
    ],
)
def test_an_empty_path_option_is_refused_not_defaulted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], option: str
) -> None:
    """`--config "$UNSET"` never reads ./deploy.toml, `--out ""` never writes into the working directory."""
    (tmp_path / "deploy.toml").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert result.exit_code == 2
    assert f"Invalid value for '{option}': an empty path" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.toml"]


LOCAL = '[hosts.box]\ntransport = "local"\ngpus = 8\n[models.a]\nrepo = "org/a"\ngpus = [0]\n'


@pytest.mark.parametrize(
    "args,code",
    [
        (["switch", "nope"], 2),
        (["switch", "a", "nope"], 2),
        (["stage", "nope"], 2),
        (["stop", "nope"], 2),
        (["plan", "nope"], 2),
        (["tune", "nope"], 2),
        (["rollback"], 2),
        (["bench"], 2),
        (["history", "--limit", "0"], 2),
        (["status", "--group", "g"], 2),
        (["models", "--config", "/nonexistent/deploy.toml"], 2),
        (["config", "show"], 6),
    ],
)
def test_every_json_command_prints_one_json_document_even_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], code: int
) -> None:
    """A --json consumer always gets one document on stdout: the error, its exit code and type (text on stderr)."""
    (tmp_path / "deploy.toml").write_text(LOCAL)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORCHESTRATOR_STATE_DIR", str(tmp_path / "state"))
    result = invoke(*args, "--json")
    assert result.exit_code == code, result.output
    error = json.loads(result.stdout)["error"]  # json.loads refuses a second document
    assert error["exit_code"] == code and error["message"] in result.stderr


class Answers:
    """The backend of a CLI command, answering each switch with the next canned result or error."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)

    def call(self, op: Any, args: dict[str, Any], progress: Any = None) -> dict[str, Any]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_switching_several_models_with_json_prints_one_list(capsys: pytest.CaptureFixture[str]) -> None:
    """`switch a b --json` prints one JSON list of both results, not two documents; a failed one exits 1."""
    from orchestrator.cli.deploy_cmds import _switch_all_json

    a, b = {"model": "a", "outcome": "active"}, {"model": "b", "outcome": "rolled_back"}
    with pytest.raises(SystemExit) as info:
        _switch_all_json(Answers(a, b), ["a", "b"], False, False)
    assert info.value.code == 1 and json.loads(capsys.readouterr().out) == [a, b]


def test_an_error_after_some_switches_keeps_their_results() -> None:
    """The second switch refused (busy): the first one's result travels with the error, nothing lost."""
    from orchestrator.cli.deploy_cmds import _switch_all_json

    a = {"model": "a", "outcome": "active"}
    with pytest.raises(Busy) as info:
        _switch_all_json(Answers(a, Busy("host box: switch of c runs")), ["a", "b"], False, False)
    assert info.value.partial == [a]
