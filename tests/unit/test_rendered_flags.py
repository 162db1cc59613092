"""The flags the units render, named once: the engine's accessor (Engine.rendered_flags) and core/ray_start.py
hold every flag the renderer writes, so what deploy.toml's args and ray_args may not repeat cannot drift from it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator.core import adopt as a
from orchestrator.core import ray_start
from orchestrator.core.catalog import Catalog
from orchestrator.core.multinode import render_nodes
from orchestrator.engines import ENGINE, Launch
from orchestrator.errors import ConfigError
from orchestrator.resources import template_text

from .test_catalog_args import RAY, load

FLAGS = ENGINE.rendered_flags


def _flags(words: list[str] | tuple[str, ...]) -> set[str]:
    return {w for w in words if w.startswith("-")}


def test_every_flag_of_one_nodes_command_line_is_in_the_accessor() -> None:
    """The engine's argv with every key set writes only flags its rendered_flags (or sleep_flags) name."""
    launch = Launch(
        command=("vllm", "serve"),
        model_dir="/m",
        served="m",
        bind="0.0.0.0",
        port=8000,
        tensor_parallel=2,
        pipeline_parallel=2,
        data_parallel=2,
        expert_parallel=True,
        sleep=True,
        max_model_len=4096,
        max_num_seqs=8,
    )
    written = _flags(ENGINE.argv(launch))
    assert written <= {*FLAGS.keyed, *FLAGS.switches, *ENGINE.sleep_flags}
    assert {f for f in FLAGS.keyed if f.startswith("--")} <= written  # every long keyed flag is really written


def test_every_per_node_flag_is_in_the_accessor_and_every_one_there_is_written() -> None:
    """node_args (both shapes, first and later ranks) and ray_args write exactly the accessor's per-node flags."""
    written: set[str] = set()
    for local in (None, 2):
        for rank in (0, 1):
            written |= _flags(
                ENGINE.node_args(nodes=2, rank=rank, head_address="10.0.0.1", port=29500, data_parallel_local=local)
            )
    written |= _flags(ENGINE.ray_args)
    assert written == set(FLAGS.node)


def test_every_ray_start_option_the_units_render_is_refused_in_ray_args(tmp_path: Path) -> None:
    """The options of the rendered ray-head and ray-worker units are core/ray_start.py's table,
    each refused in ray_args."""
    cat = Catalog.model_validate(
        {
            "hosts": {"g1": {"address": "10.0.0.1", "gpus": 2}, "g2": {"address": "10.0.0.2", "gpus": 2}},
            "models": {
                "big": {
                    "repo": "org/big",
                    "nodes": ["g1", "g2"],
                    "gpus": [0, 1],
                    "tensor_parallel": 2,
                    "pipeline_parallel": 2,
                    "backend": "ray",
                }
            },
        }
    )
    units = render_nodes(cat, cat.models["big"], template_text).nodes
    exec_starts = [re.search(r"^ExecStart=(.*)$", u.unit_text, re.MULTILINE) for u in units]
    rendered = {w.strip('"') for m in exec_starts if m for w in m.group(1).split() if w.startswith('"-')}
    assert rendered == set(ray_start.RENDERED)
    for flag in ray_start.RENDERED:
        with pytest.raises(ConfigError, match=re.escape(f"models.big.ray_args[0]: '{flag}': the Ray units render")):
            load(tmp_path, f'ray_args = ["{flag}"]\n', RAY)


def test_core_reads_the_engines_flags_through_the_engine() -> None:
    """No module of core imports engines/vllm_argv.py: the catalog's check and adopt ask the Engine."""
    core = Path(__file__).resolve().parents[2] / "orchestrator" / "core"
    importers = [
        p.name
        for p in core.glob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("vllm_argv")
    ]
    assert importers == []


def test_adopting_a_headless_rank_is_blocked() -> None:
    """A found engine that is one node's rank of a multi-node model cannot become a one-box entry:
    a blocker names it."""
    argv = (
        "/opt/ml-env/bin/vllm",
        "serve",
        "/m/big",
        "--served-model-name",
        "big",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "10.0.0.1",
        "--headless",
    )
    target = a.Target(
        host="box",
        engine=("/opt/ml-env/bin/vllm", "serve"),
        bind="0.0.0.0",
        user="vllm",
        env_dir="/etc/orchestrator/env",
    )
    blockers = "\n".join(a.adopt(a.Found(argv=argv, pid=7), target).blockers)
    assert "--nnodes 2: this engine is one node's rank" in blockers and "--headless: this engine" in blockers
    assert "--node-rank 1: this engine" in blockers and "--master-addr" not in blockers
    alone = ("/opt/ml-env/bin/vllm", "serve", "/m/x", "--served-model-name", "x", "--nnodes", "1")
    assert a.adopt(a.Found(argv=alone, pid=8), target).blockers == ()
