"""Rendering a sleep-enabled model: --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 only for it, and
its engine on loopback behind the front proxy."""

from __future__ import annotations

from pathlib import Path

from orchestrator import settings
from orchestrator.core.catalog import Catalog
from orchestrator.core.render import engine_address, engine_argv, engine_bind, render_unit
from orchestrator.deploy.planning import default_template

from .test_render import systemd_verify, verify_root

TOML = """
state_dir = "/var/lib/orchestrator"
[defaults]
bind = "{bind}"
[hosts.box]
address = "10.0.0.5"
gpus = 8
[models.warm]
repo = "org/warm"
gpus = [0]
port = 8001
sleep = "level1"
[models.cold]
repo = "org/cold"
gpus = [1]
port = 8002
[proxy]
enabled = {proxy}
port = 9000
"""


def catalog(bind: str = "10.0.0.5", proxy: bool = True) -> Catalog:
    return settings.load_text(TOML.format(bind=bind, proxy=str(proxy).lower()), "deploy.toml")


def test_only_a_sleep_model_gets_sleep_mode_and_dev_mode() -> None:
    """The sleep model's unit has the flag and the variable; the other model's has neither."""
    cat = catalog()
    warm = render_unit(cat, cat.models["warm"], default_template()).text
    cold = render_unit(cat, cat.models["cold"], default_template()).text
    assert '"--enable-sleep-mode"' in warm and 'Environment="VLLM_SERVER_DEV_MODE=1"' in warm
    assert "sleep-mode" not in cold and "VLLM_SERVER_DEV_MODE" not in cold


def test_a_sleep_engine_behind_the_proxy_binds_to_loopback() -> None:
    """With the proxy on, the sleep model listens on 127.0.0.1 whatever the bind; the other keeps the bind."""
    cat = catalog()
    box = cat.hosts["box"]
    warm, cold = engine_argv(cat, cat.models["warm"], "/m", box), engine_argv(cat, cat.models["cold"], "/m", box)
    assert warm[warm.index("--host") + 1] == "127.0.0.1" == engine_bind(cat, cat.models["warm"], box)
    assert cold[cold.index("--host") + 1] == "10.0.0.5"


def test_a_sleep_engine_without_the_proxy_keeps_its_loopback_bind() -> None:
    """No proxy and bind ::1: the engine listens where it was told (the catalog allows only loopback)."""
    cat = catalog(bind="::1", proxy=False)
    argv = engine_argv(cat, cat.models["warm"], "/m", cat.hosts["box"])
    assert argv[argv.index("--host") + 1] == "::1"


def test_a_sleep_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """The sleep model's unit, flag and variable included, is accepted by real systemd-analyze verify."""
    cat = catalog()
    unit = render_unit(cat, cat.models["warm"], default_template())
    done = systemd_verify(verify_root(tmp_path, cat), unit.name, unit.text)
    assert done.returncode == 0, done.stderr


def test_the_product_reaches_a_loopback_engine_at_loopback() -> None:
    """engine_address (a UnitSpec's address) is 127.0.0.1 for the sleep model behind the proxy, the host's otherwise."""
    cat = catalog()
    box = cat.hosts["box"]
    assert (engine_address(cat, cat.models["warm"], box), engine_address(cat, cat.models["cold"], box)) == (
        "127.0.0.1",
        "10.0.0.5",
    )
