"""The README and the docs site stay usable: the README's first two lines are the commands CI and readers
run, its links resolve, the tutorial's test-host commands are the ones scripts/demo.py runs, and every
generated reference section builds from today's code (mkdocs build --strict runs in the fast lane too)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.builders.source import parse

from .test_readme_walkthrough import block_after

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def test_readme_starts_with_the_demo_and_test_commands() -> None:
    """CI and readers depend on these two lines being the README's first."""
    first, second = README.read_text().splitlines()[:2]
    assert first.startswith("    bash scripts/demo.sh     # (as root) set up, boot a local systemd test host")
    assert second.startswith("    bash scripts/test.sh     # set up, a fast lane")


def test_readme_links_resolve() -> None:
    """Every relative link of the README names a file of the repository (the docs pages included)."""
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "no relative links found"
    missing = [link for link in local if link and not (REPO / link).exists()]
    assert not missing, missing


def demo_commands() -> list[str]:
    """The `orchestrator ...` commands scripts/demo.py runs, in order (its `orchestrator(*args)` calls)."""
    tree = parse(REPO / "scripts/demo.py")
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "orchestrator"
    ]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    return ["orchestrator " + " ".join(ast.literal_eval(arg) for arg in call.args) for call in calls]


def test_tutorial_test_host_commands_are_the_demos() -> None:
    """The tutorial's "try it on a test host" block lists what `bash scripts/demo.sh` really runs."""
    shown = block_after("tutorial-demo-commands").split("\n")
    assert [line for line in shown if line] == demo_commands()


def test_every_docs_page_is_in_the_nav() -> None:
    """A page missing from mkdocs.yml's nav is a page nobody finds."""
    nav = (REPO / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
    assert [p for p in pages if p not in nav] == []


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "docs/hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["cli", "config-keys", "exit-codes", "metrics", "states", "states-diagram"])
def test_generated_reference_section_builds(name: str) -> None:
    """Each generated section builds from the code (a deploy.toml key without a meaning fails here)."""
    text = _hooks().GENERATORS[name]()
    assert text.strip()


def test_every_generated_marker_is_used() -> None:
    """Each generator fills a page (a section left out of every page is dead code)."""
    used = set(
        re.findall(r"<!-- generated: ([a-z-]+) -->", "".join(p.read_text() for p in (REPO / "docs").rglob("*.md")))
    )
    assert used == set(_hooks().GENERATORS)
