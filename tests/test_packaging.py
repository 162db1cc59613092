"""A normal (non-editable) install carries everything the tool reads at run time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel and installed into a directory of its own (no source tree)."""
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(work / "dist"),
            str(REPO),
        ],
        check=True,
        cwd=work,
    )
    (wheel,) = (work / "dist").glob("orchestrator-*.whl")
    target = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        cwd=work,
    )
    return target


def _run(installed: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The installed copy comes first on the path, so nothing is read from the checkout.
    env = {**os.environ, "PYTHONPATH": str(installed), "PYTHONSAFEPATH": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_render_from_a_wheel_finds_the_templates(installed: Path, tmp_path: Path) -> None:
    """`orchestrator render --agent`, run from an unrelated directory, renders every unit."""
    (tmp_path / "deploy.toml").write_text((REPO / "deploy.toml").read_text())
    proc = _run(installed, tmp_path, "-m", "orchestrator", "render", "--agent", "--out", "out")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert (out / "orchestrator-agent.service").is_file()
    shipped = {p.name: p.read_text() for p in (REPO / "units").iterdir()}
    assert {n: (out / n).read_text() for n in shipped} == shipped


def test_switch_code_path_reads_the_shipped_unit_template(installed: Path, tmp_path: Path) -> None:
    """The engine's default template is the packaged copy of templates/vllm.service.j2."""
    code = (
        "import orchestrator, sys; from orchestrator.deploy.planning import default_template;"
        "sys.stdout.write(orchestrator.__file__ + '\\n' + default_template())"
    )
    proc = _run(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    origin, text = proc.stdout.split("\n", 1)
    assert origin.startswith(str(installed))
    assert text == (REPO / "templates" / "vllm.service.j2").read_text()


def test_the_wheel_carries_the_dashboard_templates_static_files_and_grafana_json(
    installed: Path, tmp_path: Path
) -> None:
    """The agent installed from a wheel renders its dashboard and serves uPlot and its licence."""
    code = (
        "import json, sys; from importlib import resources as r; d = r.files('orchestrator.dashboard');"
        "from orchestrator.dashboard.pages import _env;"
        "names = ['static/uPlot.iife.min.js', 'static/uPlot.LICENSE.txt', 'static/dashboard.js',"
        " 'static/dashboard.css', 'grafana.json'];"
        "print(json.dumps({n: d.joinpath(n).is_file() for n in names}));"
        "print(sorted(_env().list_templates()))"
    )
    proc = _run(installed, tmp_path, "-c", code)
    assert proc.returncode == 0, proc.stderr
    files, templates = proc.stdout.splitlines()
    assert all(json.loads(files).values()), files
    assert "box.html.j2" in templates and "tune.html.j2" in templates
