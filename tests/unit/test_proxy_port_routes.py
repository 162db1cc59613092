"""The front-proxy port takes the host's routing, not rendered text: its adapter renders the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator import settings
from orchestrator.adapters.haproxy import HaproxyProxy
from orchestrator.core.proxy import DEMAND_LUA, HostRouting, Route, host_routing, render_host
from orchestrator.resources import template_text
from orchestrator.testing import FakeProxy
from tests.builders.toml import LOCAL_PROXY_BOX


@pytest.fixture
def routing(tmp_path: Path) -> tuple[Any, HostRouting]:
    path = LOCAL_PROXY_BOX.write(tmp_path, state=str(tmp_path / "state"), proxy="", enabled="true")
    cat = settings.load(path)
    return cat, host_routing(cat, "box", cat.defaults.bind, [Route("alpha", "127.0.0.1", 8001)])


def test_the_routing_carries_what_the_catalog_says_of_the_host(routing: tuple[Any, HostRouting]) -> None:
    """A host's routing holds its routes, the catalog's names of the host and the proxy's settings."""
    cat, r = routing
    assert r.routes == (Route("alpha", "127.0.0.1", 8001),)
    assert set(r.known) == {cat.models[m].served for m in cat.models_on("box")}
    assert r.proxy == cat.proxy and r.bind == cat.defaults.bind


def test_the_adapter_renders_the_routing_as_render_host(
    routing: tuple[Any, HostRouting], monkeypatch: pytest.MonkeyPatch
) -> None:
    """HaproxyProxy.apply serves the config render_host gives for the same routes (the shipped template)."""
    cat, r = routing
    served: list[str] = []
    monkeypatch.setattr(HaproxyProxy, "apply_config", lambda self, config: served.append(config) or True)
    port = HaproxyProxy(None, None, cat.proxy, r.bind, "")  # type: ignore[arg-type]
    assert port.apply(r)
    assert served == [
        render_host(cat, "box", r.bind, r.routes, template_text("haproxy.cfg.j2"), template_text(DEMAND_LUA))
    ]


def test_the_fake_serves_what_the_adapter_would(
    routing: tuple[Any, HostRouting], monkeypatch: pytest.MonkeyPatch
) -> None:
    """FakeProxy keeps the routing and the very config the adapter renders from it; the same again is no change."""
    cat, r = routing
    served: list[str] = []
    monkeypatch.setattr(HaproxyProxy, "apply_config", lambda self, config: served.append(config) or True)
    HaproxyProxy(None, None, cat.proxy, r.bind, "").apply(r)  # type: ignore[arg-type]
    fake = FakeProxy()
    assert fake.apply(r) and fake.routing == r and fake.config == served[0]
    assert not fake.apply(r)


class _Files:
    """A shell of files in memory (what prepare and apply read and write); runs nothing."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def read_file(self, path: str) -> bytes | None:
        return self.files.get(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self.files[path] = data

    def run(self, argv: list[str], **kw: Any) -> Any:
        return None


class _Running:
    """The proxy unit installed as rendered and active."""

    def __init__(self, unit_text: str) -> None:
        self.unit_text = unit_text

    def read_unit(self, name: str) -> str:
        return self.unit_text

    def unit_state(self, name: str) -> Any:
        return type("State", (), {"is_active": True, "is_failed": False})()


def test_prepare_checks_the_config_once_and_apply_of_it_does_not_check_again(
    routing: tuple[Any, HostRouting], monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare has HAProxy check the routing's config and writes nothing it serves from; apply of the same
    routing then skips the check (a warm switch's route move is the reload alone)."""
    from orchestrator.core.proxy import sha

    cat, r = routing
    checked: list[str] = []
    monkeypatch.setattr(HaproxyProxy, "_check", lambda self, config: checked.append(config))
    shell = _Files()
    port = HaproxyProxy(shell, _Running("unit"), cat.proxy, r.bind, "unit")  # type: ignore[arg-type]
    port.prepare(r)
    assert len(checked) == 1 and cat.proxy.config_path not in shell.files
    shell.files[cat.proxy.config_path + ".applied"] = sha(checked[0]).encode()  # past the reload: no master here
    assert port.apply(r) is False and len(checked) == 1
    port.prepare(r)  # what it serves already: nothing to check
    assert len(checked) == 1


def test_the_fake_prepares_the_config_it_would_serve(routing: tuple[Any, HostRouting]) -> None:
    """FakeProxy.prepare keeps the config apply would serve, and serves nothing new."""
    _, r = routing
    fake = FakeProxy()
    fake.prepare(r)
    assert fake.config is None and fake.applied == []
    assert fake.apply(r) and fake.prepared == [fake.config]
