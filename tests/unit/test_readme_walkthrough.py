"""The docs' Kimi-K2 multi-node walk-through (docs/howto/multi-node.md) stays true: its deploy.toml excerpt
(native and the Ray variant) loads with the settings loader, and the `plan` output it shows is what `plan`
prints. ``block_after`` and ``shown_command`` read the README and every page under docs/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator import settings

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = (README, *sorted((REPO / "docs").rglob("*.md")))
K2 = REPO / "tests/fixtures/configs/moonshotai__Kimi-K2-Instruct.json"


def doc_lines() -> list[str]:
    """The README's lines, then every docs page's."""
    return [line for page in DOCS for line in page.read_text().splitlines()]


def block_after(marker: str, text: str | None = None) -> str:
    """The code block (indented, or fenced with ```) that follows a `<!-- readme-snippet: NAME -->`
    line of the README or a docs page, unindented."""
    lines = text.splitlines() if text else doc_lines()
    start = lines.index(f"<!-- readme-snippet: {marker} -->") + 1
    out: list[str] = []
    if lines[start].startswith("```"):
        for line in lines[start + 1 :]:
            if line.startswith("```"):
                break
            out.append(line)
        return "\n".join(out).strip() + "\n"
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        out.append(line[4:])
    return "\n".join(out).strip() + "\n"


def shown_command(prefix: str) -> tuple[str, list[str]]:
    """A `$ orchestrator plan ...` line of an indented block of the docs and the output lines shown under
    it (up to the next `$` line or the end of the block)."""
    lines = doc_lines()
    i = next(n for n, line in enumerate(lines) if line.startswith(f"    $ {prefix}"))
    out: list[str] = []
    for line in lines[i + 1 :]:
        if not line.startswith("    ") or line.startswith("    $ "):
            break
        out.append(line[4:])
    return lines[i][6:], out


def walkthrough_dir(tmp_path: Path, model_lines: str | None = None) -> Path:
    text = block_after("kimi-k2-deploy.toml")
    if model_lines is not None:
        text = "".join(
            model_lines if line.startswith("backend = ") else "" if line.startswith("master_port = ") else line
            for line in text.splitlines(keepends=True)
        )
    (tmp_path / "deploy.toml").write_text(text)
    shutil.copy(K2, tmp_path / "kimi-k2-config.json")
    return tmp_path / "deploy.toml"


def test_native_excerpt_loads_as_two_nodes_tp8_pp2(tmp_path: Path) -> None:
    """The walk-through's deploy.toml loads: kimi-k2 on box1 + box2, native backend, TP=8 x PP=2."""
    cat = settings.load(walkthrough_dir(tmp_path))
    m = cat.models["kimi-k2"]
    assert (m.nodes, m.backend, m.tensor_parallel, m.pipeline_parallel) == (("box1", "box2"), "native", 8, 2)
    assert [cat.hosts[n].peer_address for n in m.nodes] == ["192.168.100.1", "192.168.100.2"]


def test_ray_variant_lines_load_as_a_ray_model(tmp_path: Path) -> None:
    """The excerpt with the walk-through's two Ray lines (in place of backend/master_port) loads as
    backend ray."""
    cat = settings.load(walkthrough_dir(tmp_path, block_after("kimi-k2-ray-lines")))
    m = cat.models["kimi-k2"]
    assert (m.backend, m.ray_port) == ("ray", 6379)


def test_plan_output_shown_is_what_plan_prints(tmp_path: Path) -> None:
    """Both `orchestrator plan` runs shown (one box refused, two boxes valid) print what the walk-through
    shows."""
    walkthrough_dir(tmp_path)
    base = "orchestrator plan --config kimi-k2-config.json --gpus 8 --gpu-memory-gib 96"
    for prefix, code in ((f"{base} --tp 8", 3), (f"{base} --nodes 2", 0)):
        command, shown = shown_command(prefix)
        r = subprocess.run(
            [sys.executable, "-m", "orchestrator", *command.split()[1:]],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            check=False,
        )
        assert r.returncode == code, r.stderr
        printed = r.stdout.splitlines()
        head = [line for line in shown if line != "..."]
        assert printed[: len(head)] == head, (command, printed)
