"""Where `plan` finds a model's config.json: a local file, staged weights, its cache, then the hub."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hubstub import HubStub, StubRepo

REPO = Path(__file__).resolve().parents[2]
MINIMAX = REPO / "tests/fixtures/configs/MiniMaxAI__MiniMax-M2.5.json"
SHIPPED = REPO / "deploy.toml"


@pytest.fixture
def closed_endpoint() -> str:
    """A loopback URL where nothing listens: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        stub.add(StubRepo.of("MiniMaxAI/MiniMax-M2.5", {"config.json": MINIMAX.read_bytes()}))
        yield stub


def plan(tmp_path: Path, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": endpoint, "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_TOKEN": ""}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "plan", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
        timeout=120,
    )


def catalog(tmp_path: Path, extra: str = "") -> Path:
    """The shipped deploy.toml without its shipped config.json files (shipped:NAME): plan must look elsewhere."""
    text = re.sub(r'^config = "shipped:.*\n', "", SHIPPED.read_text(), flags=re.MULTILINE)
    path = tmp_path / "deploy.toml"
    path.write_text(text.replace("[models.minimax-m25-ep]\n", f"[models.minimax-m25-ep]\n{extra}", 1))
    return path


def test_unreachable_hub_is_one_line_and_exit_4(tmp_path: Path, closed_endpoint: str) -> None:
    """A model with no `config` and no hub: one line naming the endpoint and the way out, no retries, exit 4."""
    r = plan(tmp_path, closed_endpoint, "minimax-m25-ep", "--config", str(catalog(tmp_path)))
    assert r.returncode == 4 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"the hub at {closed_endpoint} cannot be reached" in r.stderr
    assert "models.minimax-m25-ep.config" in r.stderr and "Retry" not in r.stderr


def test_fetched_config_is_cached_and_used_offline(tmp_path: Path, hub: HubStub, closed_endpoint: str) -> None:
    """A config fetched once is kept; the next plan uses it with the hub gone, without asking again."""
    first = plan(tmp_path, hub.url, "minimax-m25-ep", "--config", str(catalog(tmp_path)))
    assert first.returncode == 0 and f"from the hub at {hub.url}" in first.stdout, first.stderr
    second = plan(tmp_path, closed_endpoint, "minimax-m25-ep", "--config", str(catalog(tmp_path)))
    assert second.returncode == 0 and "cached copy of MiniMaxAI/MiniMax-M2.5@main" in second.stdout, second.stderr
    assert len(hub.gets("config.json")) == 1


def test_gated_repo_names_the_token(tmp_path: Path, closed_endpoint: str) -> None:
    """A 401 from the hub is bad input (exit 2) and says HF_TOKEN is missing or not accepted."""
    with HubStub() as gated:
        gated.add(StubRepo.of("MiniMaxAI/MiniMax-M2.5", {"config.json": b"{}"}, token="secret"))
        r = plan(tmp_path, gated.url, "minimax-m25-ep", "--config", str(catalog(tmp_path)))
    assert r.returncode == 2 and "HTTP 401" in r.stderr and "HF_TOKEN" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_model_config_key_plans_offline(tmp_path: Path, closed_endpoint: str) -> None:
    """models.NAME.config (relative to deploy.toml) is used as is; the hub is never asked."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/minimax.json").write_bytes(MINIMAX.read_bytes())
    cfg = catalog(tmp_path, 'config = "configs/minimax.json"\n')
    r = plan(tmp_path, closed_endpoint, "minimax-m25-ep", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert f"config.json: {tmp_path / 'configs/minimax.json'} (models.minimax-m25-ep.config)" in r.stdout


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "file not found"),
        ("not json", "not a valid config.json (not valid JSON"),
        ("[1, 2]", "not a valid config.json (a JSON list, not an object)"),
    ],
)
def test_model_config_key_must_name_a_json_object(tmp_path: Path, content: str | None, message: str) -> None:
    """A missing or invalid models.NAME.config is one error naming the file, the key and the path."""
    if content is not None:
        (tmp_path / "c.json").write_text(content)
    cfg = catalog(tmp_path, 'config = "c.json"\n')
    r = subprocess.run(
        [sys.executable, "-m", "orchestrator", "models", "--config", str(cfg)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"{cfg}: models.minimax-m25-ep.config: {tmp_path / 'c.json'}: {message}" in r.stderr


@pytest.fixture
def models_dir() -> Iterator[Path]:
    """A models_dir outside /tmp and /var/tmp (deploy.toml refuses those: units cannot see them)."""
    path = Path(tempfile.mkdtemp(prefix="orchestrator-test-models-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path)


def test_staged_config_is_read_before_the_cache(tmp_path: Path, closed_endpoint: str, models_dir: Path) -> None:
    """On the GPU box itself (transport local) the staged weights' config.json is used."""
    staged = models_dir / "MiniMaxAI--MiniMax-M2.5/main"
    staged.mkdir(parents=True)
    (staged / "config.json").write_bytes(MINIMAX.read_bytes())
    cfg = catalog(tmp_path)
    cfg.write_text(cfg.read_text().replace('models_dir = "/shared/models"', f'models_dir = "{models_dir}"'))
    r = plan(tmp_path, closed_endpoint, "minimax-m25-ep", "--config", str(cfg))
    assert r.returncode == 0 and f"config.json: staged weights in {staged}" in r.stdout, r.stderr


@pytest.mark.parametrize("name", ["deploy.toml", "deploy"])
def test_bad_toml_is_reported_as_toml(tmp_path: Path, name: str) -> None:
    """plan --config with a TOML syntax error says so (not 'not readable JSON'), exit 2."""
    bad = tmp_path / name
    bad.write_text('state_dir = "x"\n[hosts\n')
    r = plan(tmp_path, "http://127.0.0.1:9", "minimax-m25", "--config", str(bad))
    assert r.returncode == 2 and "not valid TOML" in r.stderr and "line 2" in r.stderr and "JSON" not in r.stderr
