"""vLLM has one home, orchestrator/engines/: no other file of the package names it, beyond a short list."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"

# Files outside orchestrator/engines/ that may name vLLM, each with why it must. Everything else asks the
# engine (orchestrator.engines: ENGINES, a model's `engine_name`) and speaks of "the engine".
ALLOWED = {
    # The load generator defines its figures as `vllm bench serve` does, the tool they are compared with
    # (bench/gpu/ENGINE_CHECK.md); naming that tool is the definition, not engine-specific behaviour.
    "loadgen/model.py": "figures defined as vllm bench serve's",
    "loadgen/stats.py": "percentiles as vllm bench serve's",
    "loadgen/sse.py": "token timing as vllm bench serve's client",
    "loadgen/loadgen.py": "a level's window as vllm bench serve's; its prefix-cache block, its ignore_eos",
    # The fake host simulates the one engine measured on a GPU: its process name (VLLM::EngineCore) and
    # its sleep API's failures, as the H200 showed them.
    "testing/host.py": "a simulation of vLLM as measured",
    # A shipped Grafana dashboard: "vllm" is one of its search tags.
    "dashboard/grafana.json": "a dashboard tag",
}


def naming_vllm() -> set[str]:
    """Every file of the package outside engines/ whose text names vLLM (any case)."""
    found = set()
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(PACKAGE).as_posix()
        if not path.is_file() or rel.startswith("engines/") or "__pycache__" in path.parts:
            continue
        if b"vllm" in path.read_bytes().lower():
            found.add(rel)
    return found


def test_only_the_allowed_files_outside_engines_name_vllm() -> None:
    """A file outside orchestrator/engines/ that names vLLM and is not on the allow-list fails the suite."""
    assert naming_vllm() - set(ALLOWED) == set()


def test_every_allowed_file_still_names_vllm() -> None:
    """An allow-list entry whose file no longer names vLLM is dropped from the list (it only shrinks)."""
    assert set(ALLOWED) - naming_vllm() == set()
