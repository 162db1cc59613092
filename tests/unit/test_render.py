"""Unit rendering: real `systemd-analyze verify` accepts what we write; hostile values never get in."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import settings as deploy_settings
from orchestrator.core.catalog import Catalog
from orchestrator.core.render import render_unit
from orchestrator.deploy.planning import default_template
from orchestrator.errors import ConfigError, OrchestratorError, RenderError

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = default_template()


def verify_root(tmp: Path, catalog: Catalog) -> Path:
    """A root tree with systemd's own units and each host's engine executable, for --root verify."""
    root = tmp / "root"
    if not root.exists():
        shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
        (root / "etc/systemd/system").mkdir(parents=True)
    for host in catalog.hosts.values():
        exe = root / catalog.engine_command(host)[0].lstrip("/")
        exe.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy("/bin/true", exe)
    return root


def systemd_verify(root: Path, name: str, text: str) -> subprocess.CompletedProcess[str]:
    (root / "etc/systemd/system" / name).write_text(text)
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", name], capture_output=True, text=True, check=False
    )


def directives(text: str) -> list[str]:
    return [line.split("=", 1)[0] for line in text.splitlines() if line and not line.startswith(("#", "["))]


def test_shipped_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """Every unit rendered from the shipped deploy.toml is accepted by systemd-analyze verify."""
    catalog = deploy_settings.load(REPO / "deploy.toml")
    root = verify_root(tmp_path, catalog)
    for model in catalog.models.values():
        unit = render_unit(catalog, model, TEMPLATE)
        result = systemd_verify(root, unit.name, unit.text)
        assert result.returncode == 0, f"{unit.name}: {result.stdout}{result.stderr}"


def test_unit_takes_whole_engine_tree_down(tmp_path: Path) -> None:
    """The unit kills the whole cgroup on stop and gives the engine time to shut down cleanly."""
    catalog = deploy_settings.load(REPO / "deploy.toml")
    text = render_unit(catalog, catalog.models["minimax-m25"], TEMPLATE).text
    assert "KillMode=control-group" in text
    assert "TimeoutStopSec=120" in text
    assert 'Environment="CUDA_VISIBLE_DEVICES=0,1,2,3"' in text
    assert 'Environment="VLLM_ENGINE_READY_TIMEOUT_S=600"' in text
    assert "EnvironmentFile=-/etc/orchestrator/env/minimax-m25.env" in text
    assert "User=vllm" in text and "Restart=on-failure" in text


def base(**model: object) -> dict[str, object]:
    return {
        "hosts": {"h": {"gpus": 2, "engine": ["/opt/vllm/bin/vllm", "serve"]}},
        "models": {"m": {"repo": "org/m", "gpus": [0], **model}},
    }


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("args", ["--x", "a\nExecStartPre=/bin/rm -rf /"], " control character '\\n'"),
        ("args", ["bad\rvalue"], "control character '\\r'"),
        ("args", ['--chat-template="unbalanced'], 'unbalanced " quote'),
        ("served_name", "name\x00", "control character '\\x00'"),
        ("env", {"FOO": "x\nUser=root"}, "value of FOO 'x\\nUser=root'"),
        ("repo", "org/m'", "unbalanced ' quote"),
    ],
)
def test_hostile_values_are_rejected(field: str, value: object, named: str) -> None:
    """A newline, control character or unbalanced quote is refused, naming the value."""
    with pytest.raises((RenderError, ValueError), match=re.escape(named)):
        catalog = Catalog.model_validate(base(**{field: value}))
        render_unit(catalog, catalog.models["m"], TEMPLATE)


def test_bad_model_name_is_rejected(tmp_path: Path) -> None:
    """Model names become unit names: only a safe alphabet is accepted."""
    cfg = tmp_path / "deploy.toml"
    cfg.write_text('[hosts.h]\ngpus = 1\n[models."../etc"]\nrepo = "a/b"\ngpus = [0]\n')
    with pytest.raises(ConfigError, match=r"models\.\.\./etc"):
        deploy_settings.load(cfg)


_text = st.text(st.characters(codec="utf-8"), max_size=24)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arg=_text, env_value=_text, served=_text)
def test_random_values_render_intact_or_are_refused(tmp_path: Path, arg: str, env_value: str, served: str) -> None:
    """Any string either renders into a unit systemd accepts, with no extra directive, or is refused."""
    try:
        catalog = Catalog.model_validate(base(args=["--x", arg], env={"FOO": env_value}, served_name=served or None))
        unit = render_unit(catalog, catalog.models["m"], TEMPLATE)
    except (OrchestratorError, ValueError):
        return
    reference = render_unit(
        Catalog.model_validate(base(args=["--x", "y"], env={"FOO": "z"})),
        Catalog.model_validate(base()).models["m"].model_copy(update={"args": ("--x", "y"), "env": {"FOO": "z"}}),
        TEMPLATE,
    )
    assert directives(unit.text) == directives(reference.text)
    result = systemd_verify(verify_root(tmp_path, catalog), unit.name, unit.text)
    assert result.returncode == 0, result.stdout + result.stderr


def run_cli(*args: str, pre: str = "") -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh interpreter; ``pre`` runs first (to take an optional extra away)."""
    code = f"import sys\n{pre}\nfrom orchestrator.cli import main\nsys.argv = ['orchestrator', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, check=False)


def small_config(tmp_path: Path, transport: str = "ssh") -> Path:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(f'[hosts.h]\ntransport = "{transport}"\ngpus = 1\n[models.m]\nrepo = "o/m"\ngpus = [0]\n')
    return cfg


@pytest.mark.parametrize(
    "args,message",
    [
        (["--template", "/nonexistent"], "error: --template /nonexistent: no such file\n"),
        (["--template", "/"], "error: --template /: cannot read: a directory, not a regular file\n"),
        (["--out", "{file}"], "error: --out {file}: exists and is not a directory\n"),
        (["--out", "{file}/sub"], "error: --out {file}/sub: cannot write vllm-m.service: Not a directory\n"),
    ],
)
def test_render_bad_paths_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    """A missing template or an --out that is a file exits 2 with one line naming the path; nothing is written."""
    cfg = small_config(tmp_path)
    file = tmp_path / "a-file"
    file.write_text("keep")
    result = run_cli("render", "--config", str(cfg), *[a.format(file=file) for a in args])
    assert (result.returncode, result.stderr) == (2, message.format(file=file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "deploy.toml"]
    assert file.read_text() == "keep"


def test_render_installed_without_dbus_names_the_extra(tmp_path: Path) -> None:
    """render --diff --installed on a local host without pydbus says which extra to install; exit 2."""
    cfg = small_config(tmp_path, transport="local")
    result = run_cli("render", "--config", str(cfg), "--diff", "--installed", pre="sys.modules['pydbus'] = None")
    assert result.returncode == 2
    assert result.stderr == (
        "error: host h: transport 'local' drives systemd over D-Bus, which needs the extra "
        "orchestrator[dbus] (pip install 'orchestrator[dbus]'): pydbus is not installed\n"
    )


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\u2066", "\ufeff", "\u00ad"])
def test_invisible_and_bidi_characters_are_refused(char: str) -> None:
    """Bidi overrides, zero-width and other invisible format characters (Cf) never reach a unit file."""
    with pytest.raises(ValueError, match=f"U\\+{ord(char):04X}"):
        Catalog.model_validate(base(args=["--x", f"a{char}b"]))


@pytest.mark.parametrize(
    "revision", ["../../../../etc", "/etc", "a/../b", ".hidden", "x.lock", "a b", "a:b", "-rf", "refs/heads/", "a@{1}"]
)
def test_revision_that_is_not_a_git_ref_is_refused(revision: str) -> None:
    """A revision is a commit SHA, branch or tag name by git's rules, never a path or an option."""
    with pytest.raises(ValueError, match=r"models\.m\.revision"):
        Catalog.model_validate(base(revision=revision))


def test_agent_unit_does_not_restart_on_bad_input() -> None:
    """The agent's unit stays failed on exit 2 (bad deploy.toml, newer state.db) instead of looping."""
    from orchestrator.core.render import render_agent_unit
    from orchestrator.resources import template_text

    catalog = Catalog.model_validate(base())
    unit = render_agent_unit(
        catalog,
        template_text("orchestrator-agent.service.j2"),
        python="/usr/bin/python3",
        config="/etc/orchestrator/deploy.toml",
    )
    assert "Restart=on-failure\n" in unit.text and "RestartPreventExitStatus=2\n" in unit.text
