"""deploy.toml's `engine_name`: which engine runs a model (default vllm), refused when unknown, and obeyed
by rendering, the recorded spec, the engine control and the checks of the model's own keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.core import adopt as a
from orchestrator.core.catalog import Catalog
from orchestrator.deploy.planning import default_template, unit_spec
from orchestrator.engines import ENGINES, VLLM, CommandLine
from orchestrator.engines.vllm import Vllm
from orchestrator.engines.vllm_argv import VllmCommandLine
from orchestrator.errors import ConfigError
from orchestrator.testing import FakeHost

from .conftest import make_catalog

TOML = """
[hosts.box]
gpus = 8
[models.a]
repo = "org/a"
gpus = [0]
engine_name = "sglang"
"""


class ToyCommandLine(VllmCommandLine):
    """Toy's server starts as `toy serve`; its flags read as vLLM's."""

    marker = "toy"
    forms = "`toy serve`"

    @staticmethod
    def engine_length(argv: tuple[str, ...] | list[str]) -> int | None:
        return 2 if len(argv) > 1 and argv[0].endswith("/toy") and argv[1] == "serve" else None

    @staticmethod
    def engine_words(argv: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        return tuple(argv[:2])


TOY_COMMAND_LINE = ToyCommandLine()


@dataclass(frozen=True)
class Toy(Vllm):
    """A second engine for these tests: vLLM's behaviour under another name, unit and command."""

    name: str = "toy"
    title: str = "Toy"
    default_command: tuple[str, ...] = ("/opt/toy/bin/toy", "serve")
    sleep_flags: tuple[str, ...] = ("--toy-sleep",)
    command_line: CommandLine = TOY_COMMAND_LINE

    def unit_name(self, model: str) -> str:
        return f"toy-{model}.service"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Toy:
    engine = Toy()
    monkeypatch.setitem(ENGINES, engine.name, engine)
    return engine


def catalog(**model: object) -> Catalog:
    defaults = {"engine": list(VLLM.default_command), "bind": "127.0.0.1", "load_deadline_s": 30}
    return make_catalog(
        defaults=defaults,
        models={"alpha": {"repo": "org/alpha", "gpus": [0], "port": 8000, **model}},
    )


def test_an_unknown_engine_names_the_model_the_value_the_file_and_the_known_ones(tmp_path: Path) -> None:
    """An unknown engine_name is refused with the model's key, the value, the file and the known engines."""
    path = tmp_path / "deploy.toml"
    path.write_text(TOML)
    with pytest.raises(ConfigError) as caught:
        settings.load(path)
    assert "models.a.engine_name: engine 'sglang' is not known (known: vllm)" in str(caught.value)
    assert caught.value.file == str(path)


def test_an_unknown_engine_from_the_environment_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown engine_name set by an environment variable names that variable as its origin."""
    path = tmp_path / "deploy.toml"
    path.write_text(TOML.replace('engine_name = "sglang"\n', ""))
    monkeypatch.setenv("ORCHESTRATOR_MODELS__A__ENGINE_NAME", "tgi")
    with pytest.raises(ConfigError, match="engine 'tgi' is not known") as caught:
        settings.load(path)
    assert caught.value.file == "environment variable ORCHESTRATOR_MODELS__A__ENGINE_NAME"


def test_a_model_runs_on_vllm_by_default() -> None:
    """A model that names no engine runs on vLLM, and its recorded spec says so."""
    cat = catalog()
    model = cat.models["alpha"]
    assert model.engine is VLLM
    assert unit_spec(cat, model, default_template()).engine == "vllm"


def test_a_model_on_another_engine_renders_that_engines_unit(toy: Toy) -> None:
    """engine_name picks the unit's name, its command, its title and the engine its spec records."""
    cat = catalog(engine_name="toy")
    spec = unit_spec(cat, cat.models["alpha"], default_template())
    assert (spec.unit_name, spec.engine) == ("toy-alpha.service", "toy")
    assert '"/opt/toy/bin/toy" "serve"' in spec.unit_text
    assert "Description=Toy alpha" in spec.unit_text


def test_a_sleeping_model_on_another_engine_gets_that_engines_control(toy: Toy) -> None:
    """The control that sleeps and wakes a model is its own engine's (engine_control_for)."""
    cat = catalog(engine_name="toy", sleep="level1")
    spec = unit_spec(cat, cat.models["alpha"], default_template())
    ports = FakeHost().ports()
    assert ports.engine_control_for(spec) is ports.engine_controls["toy"]


def test_a_models_args_are_checked_against_its_own_engine(toy: Toy) -> None:
    """The flags a model's args may not carry are its engine's: Toy's sleep flag only for a Toy model."""
    assert catalog(args=["--toy-sleep"]).models["alpha"].args == ("--toy-sleep",)
    with pytest.raises(ValueError, match=r"--toy-sleep.*sleep mode is the model's `sleep` setting"):
        catalog(engine_name="toy", args=["--toy-sleep"])


def test_adopt_names_the_engine_a_found_command_line_runs(toy: Toy) -> None:
    """A found engine's entry carries the engine whose command line it is (none for the default)."""
    target = a.Target(host="box", engine=VLLM.default_command, bind="0.0.0.0", user="vllm", env_dir="/etc/env")
    argv = ("--model", "/m", "--served-model-name", "m", "--port", "8001")
    found = a.adopt(a.Found(argv=("/opt/toy/bin/toy", "serve", *argv), pid=7), target)
    assert found.entry["engine_name"] == "toy"
    assert "engine_name" not in a.adopt(a.Found(argv=(*VLLM.default_command, *argv), pid=8), target).entry
