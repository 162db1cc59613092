"""`render --proxy`: the front proxy's haproxy.cfg for what serves, and `--diff` against the installed file."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import settings
from orchestrator.adapters.sqlite_store import SqliteStore
from orchestrator.core.proxy import DEMAND_LUA, render_host, routes_for
from orchestrator.core.records import ServingChange
from orchestrator.deploy.planning import default_template, unit_spec
from orchestrator.resources import template_text
from tests.builders.toml import LOCAL_PROXY_BOX

from .cli_runner import invoke


@pytest.fixture
def installed() -> Iterator[Path]:
    """A real file where the proxy's config is installed (config_path must lie under /etc/orchestrator/)."""
    path = Path("/etc/orchestrator") / f"render-proxy-test-{uuid.uuid4().hex}.cfg"
    path.parent.mkdir(exist_ok=True)
    yield path
    path.unlink(missing_ok=True)


def deploy_toml(tmp_path: Path, cfg: Path, enabled: bool = True) -> Path:
    path = LOCAL_PROXY_BOX.write(
        tmp_path, state=str(tmp_path / "state"), proxy=f'config_path = "{cfg}"', enabled=str(enabled).lower()
    )
    (tmp_path / "state").mkdir(exist_ok=True)
    return path


def serve(config: Path, *models: str) -> str:
    """Record ``models`` as the host's serving set in state.db; the config the engine writes for them."""
    cat = settings.load(config)
    store = SqliteStore(Path(cat.state_dir) / "state.db", group=cat.socket_group)
    specs = [unit_spec(cat, cat.models[m], default_template()) for m in models]
    revisions = [store.create("box", spec, "test", None, 0.0).revision for spec in specs]
    store.move_serving(ServingChange(sets=(("box", tuple(revisions)),)))
    return render_host(
        cat, "box", cat.defaults.bind, routes_for(specs), template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA)
    )


def test_render_proxy_prints_the_config_routing_what_serves(tmp_path: Path, installed: Path) -> None:
    """The printed config is the one the engine writes for the serving set, with a header per host."""
    config = deploy_toml(tmp_path, installed)
    expected = serve(config, "alpha")
    result = invoke("render", "--proxy", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert result.output == f"# host box:{installed}: routes alpha\n{expected}"


def test_render_proxy_diff_is_empty_against_the_same_installed_file(tmp_path: Path, installed: Path) -> None:
    """--diff against an installed file equal to the rendered one prints nothing and exits 0."""
    config = deploy_toml(tmp_path, installed)
    installed.write_text(serve(config, "alpha", "beta"))
    result = invoke("render", "--proxy", "--diff", "--config", str(config))
    assert (result.exit_code, result.output) == (0, "")


def test_render_proxy_diff_shows_the_route_the_installed_file_lacks(tmp_path: Path, installed: Path) -> None:
    """--diff against an older installed file shows the new route as added lines; exit 1."""
    config = deploy_toml(tmp_path, installed)
    installed.write_text(serve(config, "alpha"))
    serve(config, "alpha", "beta")
    result = invoke("render", "--proxy", "--diff", "--config", str(config))
    assert result.exit_code == 1
    added = [line for line in result.output.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert any("beta" in line for line in added), result.output
    assert f"--- box:{installed}" in result.output


def test_render_proxy_diff_without_an_installed_file_diffs_against_nothing(tmp_path: Path, installed: Path) -> None:
    """No installed config: the whole rendered one is new (from /dev/null); exit 1."""
    config = deploy_toml(tmp_path, installed)
    result = invoke("render", "--proxy", "--diff", "--config", str(config))
    assert result.exit_code == 1 and result.output.startswith("--- /dev/null")


def test_render_proxy_without_the_proxy_enabled_says_so(tmp_path: Path, installed: Path) -> None:
    """A catalog without the front proxy is refused with the setting to change; exit 2."""
    config = deploy_toml(tmp_path, installed, enabled=False)
    result = invoke("render", "--proxy", "--config", str(config))
    assert result.exit_code == 2 and "[proxy] enabled = true" in result.output


def test_render_proxy_with_a_model_is_refused_naming_it(tmp_path: Path, installed: Path) -> None:
    """The proxy's config is a whole host's: a MODEL argument is a usage error naming it; exit 2."""
    config = deploy_toml(tmp_path, installed)
    result = invoke("render", "alpha", "--proxy", "--config", str(config))
    assert result.exit_code == 2 and "drop the MODEL argument (alpha)" in result.output
