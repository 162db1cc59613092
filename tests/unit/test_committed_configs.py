"""Every deploy.toml committed (the repository's own, those under bench/, the docs' extracted ones)
loads with today's schema, or is listed here as historical with why, so a reader can try each."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.errors import ConfigError

from .test_readme_walkthrough import block_after, doc_lines

REPO = Path(__file__).resolve().parents[2]
# path (from the repository root) -> why it no longer loads; bench/README.md says the same to a reader
HISTORICAL: dict[str, str] = {}


def _committed() -> list[str]:
    found = {
        "deploy.toml",
        *(
            str(p.relative_to(REPO))
            for p in (REPO / "bench").rglob("*.toml")
            if p.name == "deploy.toml" or p.name.endswith(".deploy.toml")
        ),
    }
    return sorted(found)


def _snippets() -> list[str]:
    prefix = "<!-- readme-snippet: "
    return [
        line[len(prefix) : -4] for line in doc_lines() if line.startswith(prefix) and line.endswith("deploy.toml -->")
    ]


def test_the_bench_deploy_tomls_are_found() -> None:
    """The search finds the GPU runs' files (a moved bench/ would otherwise pass by testing nothing)."""
    assert "bench/gpu/attempt1/m1st.deploy.toml" in _committed() and _snippets()


@pytest.mark.parametrize("rel", _committed())
def test_a_committed_deploy_toml_loads_or_is_historical(rel: str) -> None:
    """It loads; a historical one does not, and is named in bench/README.md."""
    if rel in HISTORICAL:
        with pytest.raises(ConfigError):
            settings.load(REPO / rel)
        assert rel in (REPO / "bench/README.md").read_text()
        return
    cat = settings.load(REPO / rel)
    assert cat.hosts and cat.models


@pytest.mark.parametrize("name", _snippets())
def test_a_docs_deploy_toml_snippet_loads(tmp_path: Path, name: str) -> None:
    """The deploy.toml blocks of the README and the docs marked for extraction load as shown."""
    path = tmp_path / "deploy.toml"
    path.write_text(block_after(name))
    assert settings.load(path, box_files=False).models
