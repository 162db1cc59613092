"""`orchestrator doctor` and the switch's access preflight on a real systemd test host, over SSH.

The engines run as user vllm, as the shipped example has it: an engine under /root (0700) must be named
by doctor and refused by a switch before anything stops; the stand-in engine under /usr/bin passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from orchestrator import settings
from orchestrator.cli import main
from orchestrator.errors import AccessDenied
from orchestrator.wiring import operations
from tests.builders.switch import MODELS, SHIM, config_text
from tests.hosts.machine import REPO, Host, in_host

pytestmark = pytest.mark.hosts

STANDIN_VLLM = REPO / "tests" / "standin" / "vllmpkg"  # `import vllm` for /usr/bin/python3: version and flags
AS_VLLM = {"alpha": {**MODELS["alpha"], "expert_parallel": True}, "beta": MODELS["beta"]}


def as_vllm(host: Host, state: Path, engine: str) -> str:
    """The switch tests' deploy.toml with the engines run as user vllm from ``engine``."""
    text = config_text(host, state, AS_VLLM)
    text = text.replace('user = "root"', 'user = "vllm"').replace('group = "root"', 'group = "vllm"')
    text = text.replace("allow_root = true\n", "")
    text = (
        "\n".join(
            f'engine = ["{engine}", "{in_host(SHIM)}"]' if line.startswith("engine = ") else line
            for line in text.splitlines()
        )
        + "\n"
    )
    for model in AS_VLLM:
        text += f'[models.{model}.env]\nPYTHONPATH = "{in_host(STANDIN_VLLM)}"\n'
    return text


@pytest.fixture
def under_root(host: Host, tmp_path: Path) -> Path:
    cfg = tmp_path / "under-root.toml"  # the same state as `healthy`: one box, two configs
    cfg.write_text(as_vllm(host, tmp_path / "state", "/root/ml-env/bin/python3"))
    return cfg


@pytest.fixture
def healthy(host: Host, tmp_path: Path) -> Path:
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(as_vllm(host, tmp_path / "state", "/usr/bin/python3"))
    return cfg


def checks(result: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["check"]: c for c in result["checks"]}


def test_doctor_names_root_and_the_user(under_root: Path) -> None:
    """An engine under /root for user vllm: doctor fails the engine path, naming /root and vllm."""
    result = operations(settings.load(under_root), reading=True).doctor(None, [])
    path = checks(result)["engine path"]
    assert result["ok"] is False and path["status"] == "fail"
    assert "user vllm cannot enter /root " in path["detail"] and path["fix"]


def test_switch_refused_before_the_serving_model_stops(host: Host, healthy: Path, under_root: Path) -> None:
    """The same config's switch exits 2 naming the user and /root; alpha still serves, nothing recorded."""
    assert operations(settings.load(healthy)).switch("alpha")["outcome"] == "active"
    ops = operations(settings.load(under_root))
    with pytest.raises(AccessDenied) as exc:
        ops.switch("beta")
    assert exc.value.exit_code == 2
    assert "as user vllm" in str(exc.value) and "cannot enter /root " in str(exc.value)
    assert host.run(["systemctl", "is-active", "vllm-alpha.service"], check=False).stdout.strip() == "active"
    assert [h["model"] for h in ops.history(host.name)] == ["alpha"]


def test_healthy_box_reports_ok_and_exits_0(healthy: Path) -> None:
    """The stand-in engine as vllm: the interpreter imports vLLM in a transient unit, its flags exist, exit 0."""
    result = CliRunner().invoke(main, ["doctor", "--config", str(healthy), "--local"])
    assert result.exit_code == 0, result.output
    assert "ok   engine alpha: vLLM 0.25.0+standin imports with /usr/bin/python3 as user vllm" in result.output
    assert "ok   flags alpha: vLLM 0.25.0+standin has --enable-expert-parallel" in result.output
    assert "fail" not in result.output


def test_json_shape(under_root: Path) -> None:
    """--json: host, ok and one object per check with check, status, detail and fix; exit 1 on a fail."""
    result = CliRunner().invoke(main, ["doctor", "alpha", "--config", str(under_root), "--local", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert set(report) == {"host", "ok", "checks"} and report["ok"] is False
    assert all(
        set(c) == {"check", "status", "detail", "fix"} and c["status"] in ("ok", "warn", "fail")
        for c in report["checks"]
    )
    assert {"systemd", "gpus", "user vllm", "engine path", "engine alpha", "port 8101"} <= {
        c["check"] for c in report["checks"]
    }


def test_local_weights_closed_to_the_user(host: Host, tmp_path: Path) -> None:
    """A local: folder 0700 root: doctor fails its weights line naming the folder and the user; opened, ok."""
    folder = "/srv/doctor-weights/alpha"
    host.run(f"mkdir -p {folder} && echo '{{}}' > {folder}/config.json && chmod 700 {folder}")
    cfg = tmp_path / "deploy.toml"
    cfg.write_text(
        as_vllm(host, tmp_path / "state", "/usr/bin/python3").replace(
            'repo = "test/alpha"\nsource = "none"', f'repo = "test/alpha"\nsource = "local:{folder}"'
        )
    )
    try:
        closed = checks(operations(settings.load(cfg), reading=True).doctor(None, ["alpha"]))["weights alpha"]
        assert closed["status"] == "fail" and f"user vllm cannot read and enter (r-x) {folder}" in closed["detail"]
        host.run(f"chmod 755 {folder}")
        opened = checks(operations(settings.load(cfg), reading=True).doctor(None, ["alpha"]))["weights alpha"]
        assert opened["status"] == "ok" and "config.json" in opened["detail"]
    finally:
        host.run("rm -rf /srv/doctor-weights", check=False)
