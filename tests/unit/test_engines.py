"""orchestrator/engines: what is vLLM-specific, behind one interface; vLLM the one implementation.

The interface's promises, on vLLM, and the rule that makes a second engine one more module: the strings
that belong to vLLM (its unit names, its sleep flag, its dev-mode variable, its control endpoints) are
spelled in engines/ only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.core.proxy import ENGINE_CONTROL_PATHS
from orchestrator.core.render import engine_argv, render_unit
from orchestrator.engines import ENGINE, VLLM, Engine, Launch
from tests.builders.source import parse
from tests.unit.conftest import make_catalog

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"


def test_vllm_is_the_engine_and_meets_the_interface() -> None:
    engine: Engine = VLLM
    assert ENGINE is engine and engine.name == "vllm" and engine.template == "vllm.service.j2"


def test_unit_names_and_cgroups() -> None:
    assert VLLM.unit_name("kimi") == "vllm-kimi.service"
    assert VLLM.owns_cgroup(b"0::/system.slice/vllm-kimi.service\n")
    assert VLLM.owns_cgroup(b"0::/system.slice/vllm-kimi.service/payload\n")
    assert not VLLM.owns_cgroup(b"0::/system.slice/sshd.service\n")
    assert not VLLM.owns_cgroup(b"0::/user.slice/vllm-kimi.service.d/x\n")


def test_argv_and_environment_of_a_launch() -> None:
    launch = Launch(
        command=("/opt/vllm/bin/vllm", "serve"),
        model_dir="/m",
        served="chat",
        bind="127.0.0.1",
        port=8001,
        tensor_parallel=4,
        expert_parallel=True,
        sleep=True,
        gpu_memory_utilization=0.85,
        gpus=(0, 1, 2, 3),
        load_deadline_s=1800,
        args=("--trust-remote-code",),
    )
    assert VLLM.argv(launch) == [
        "/opt/vllm/bin/vllm",
        "serve",
        "--model",
        "/m",
        "--served-model-name",
        "chat",
        "--host",
        "127.0.0.1",
        "--port",
        "8001",
        "--tensor-parallel-size",
        "4",
        "--enable-expert-parallel",
        "--enable-sleep-mode",
        "--gpu-memory-utilization",
        "0.85",
        "--trust-remote-code",
    ]
    assert VLLM.environment(launch) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "VLLM_ENGINE_READY_TIMEOUT_S": "1800",
        "VLLM_SERVER_DEV_MODE": "1",
    }
    assert "VLLM_SERVER_DEV_MODE" not in VLLM.environment(Launch(command=(), model_dir="", served="", bind="", port=1))


def test_rendering_asks_the_engine() -> None:
    """core/render.py renders what the engine says: the unit's ExecStart is its argv, its sleep its flag."""
    catalog = make_catalog()
    model = catalog.models["alpha"]
    unit = render_unit(catalog, model, "{{ exec_start }}\n{{ environment | join(' ') }}\n", model_dir="/m")
    assert unit.name == VLLM.unit_name("alpha")
    assert engine_argv(catalog, model, "/m")[:2] == ["/opt/vllm/bin/vllm", "serve"]
    assert "VLLM_ENGINE_READY_TIMEOUT_S=30" in unit.text and not VLLM.sleeps(unit.text)


@pytest.mark.parametrize(
    ("command", "platform"),
    [
        (("/opt/vllm-cpu/bin/vllm", "serve"), "cpu"),
        (("/opt/vllm/bin/vllm", "serve"), "cuda"),
        (("vllm-cpu", "serve"), "cuda"),
    ],
)  # a bare name says nothing of where it was installed
def test_platform_from_the_command(command: tuple[str, ...], platform: str) -> None:
    assert VLLM.platform(command) == platform


def test_control_paths_the_proxy_refuses_are_the_engines() -> None:
    assert ENGINE_CONTROL_PATHS == VLLM.control_paths and "/sleep" in VLLM.control_paths


def test_the_engines_own_reason_in_a_log_line() -> None:
    assert VLLM.reason("(EngineCore pid=312) RuntimeError: CUDA out of memory") == (
        "RuntimeError",
        "CUDA out of memory",
    )
    assert VLLM.reason("INFO: loading weights") is None


def test_flags_a_feature_needs() -> None:
    assert VLLM.flags_needed(sleep=True, expert_parallel=False) == ["--enable-sleep-mode"]
    assert VLLM.flags_needed(sleep=False, expert_parallel=True) == ["--enable-expert-parallel"]


# What only vLLM says; spelled in engines/ alone (a literal containing it, anywhere else, is a leak).
VLLM_ONLY = (
    "--enable-sleep-mode",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_ENGINE_READY_TIMEOUT_S",
    "vllm-cpu",
    "vllm.service.j2",
    "/is_sleeping",
)


def test_vllm_specific_literals_live_in_the_engine_package() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if PACKAGE / "engines" in path.parents:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hits = [w for w in VLLM_ONLY if w in node.value]
                if hits and not _docstring_or_message(node.value):
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {hits}")
            if isinstance(node, ast.JoinedStr) and any(
                isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("vllm-")
                for v in node.values
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: an f-string unit name")
    assert found == []


def _docstring_or_message(text: str) -> bool:
    """Prose (a docstring, a message to people) may name them; code may not."""
    return " " in text.strip()


def test_the_sleep_api_is_among_the_control_paths_the_proxy_refuses() -> None:
    api = VLLM.sleep_api
    paths = (api.sleep, api.wake, api.is_sleeping, api.reload_weights, api.reset_prefix_cache)
    assert all(p in VLLM.control_paths for p in paths)


def test_sleep_levels_and_what_a_sleeper_keeps_are_the_engines() -> None:
    """vLLM's sleep API takes 1 or 2; level1 keeps the weights in host RAM, level2 drops them."""
    assert (VLLM.sleep_level("level1"), VLLM.sleep_level("level2")) == (1, 2)
    assert VLLM.sleep_keeps_weights("level1") and not VLLM.sleep_keeps_weights("level2")
