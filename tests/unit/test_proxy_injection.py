"""Values that reach HAProxy's config: each is validated as what it is (an address, a path), and the
template quotes every one, so no value can add a directive; the rendered config passes `haproxy -c`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.catalog import Catalog
from orchestrator.core.proxy import Route, render_config
from orchestrator.errors import RenderError
from orchestrator.resources import template_text
from tests.builders.haproxy import HAPROXY, Engine

REPO = Path(__file__).resolve().parents[2]

# Each one passed `haproxy -c` with an extra directive or a commented-out port before.
PAYLOADS = [
    "0.0.0.0 accept-proxy",
    "127.0.0.1:8000 backup",
    "127.0.0.1 check inter 1",
    "127.0.0.1 #",
    "127.0.0.1#",
    "127.0.0.1\tssl",
    "0.0.0.0\n    bind 0.0.0.0:9999",
    "fe80::1%eth0 backup",
    "[::1]:80",
    "1.2.3.4:8000",
    "$HOME",
    '"127.0.0.1"',
    "host name",
    "127.0.0.1,10.0.0.1",
    "-h",
    "",
    "a" * 64 + ".example",
]


def _catalog(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "proxy": {"enabled": True, "port": 8000},
        "hosts": {"box": {"transport": "local", "gpus": 8}},
        "models": {"alpha": {"repo": "org/alpha", "gpus": [0], "port": 8001}},
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section == "hosts":
            data["hosts"]["box"][field] = value
        else:
            data.setdefault(section, {})[field] = value
    return data


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("key", ["defaults.bind", "hosts.bind", "hosts.address", "hosts.node_address", "proxy.bind"])
def test_address_fields_refuse_anything_but_an_address(key: str, payload: str) -> None:
    """An address field holding more than an IP or a host name is refused, naming the field."""
    with pytest.raises(ValueError, match=key.rsplit(".", 1)[-1]):
        Catalog.model_validate(_catalog(**{key: payload}))


@pytest.mark.parametrize("value", ["0.0.0.0", "::", "::1", "127.0.0.1", "gpu1.lan", "localhost", "box-2"])
def test_address_fields_accept_addresses_and_host_names(value: str) -> None:
    """IPv4, IPv6 (bare) and DNS names are accepted in every address field."""
    cat = Catalog.model_validate(
        _catalog(**{"defaults.bind": value, "hosts.bind": value, "hosts.address": value, "proxy.bind": value})
    )
    assert cat.proxy.bind == value and cat.hosts["box"].address == value


def test_cli_names_file_key_and_value_of_an_injected_bind(tmp_path: Path) -> None:
    """`models` on a deploy.toml with an injected bind exits 2 naming the key and the value."""
    (tmp_path / "deploy.toml").write_text('[defaults]\nbind = "0.0.0.0 accept-proxy"\n[hosts.box]\ngpus = 1\n')
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", "models", "--config", str(tmp_path / "deploy.toml")],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2
    assert "defaults.bind" in done.stderr and "'0.0.0.0 accept-proxy'" in done.stderr


def _render(bind: str, routes: list[Route], **proxy: Any) -> str:
    cat = Catalog.model_validate(_catalog(**{f"proxy.{k}": v for k, v in proxy.items()}))
    return render_config(cat.proxy, bind, routes, template_text("haproxy.cfg.j2"))


def _haproxy_check(config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "haproxy.cfg"
    path.write_text(config)
    return subprocess.run([HAPROXY, "-c", "-q", "-f", str(path)], capture_output=True, text=True, check=False)


_ONE_WORD = re.compile(r'^\s*(?:bind|server engine) "(?:[^"\\]|\\.)*"$')


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if "\n" not in p and "\t" not in p and p])
def test_template_keeps_a_hostile_value_one_argument(payload: str, tmp_path: Path) -> None:
    """Given past validation, a hostile bind, engine address or route name stays one quoted word."""
    config = _render(payload, [Route("chat", payload, 8001), Route(payload, "127.0.0.1", 8002)])
    lines = [ln for ln in config.splitlines() if ln.strip().startswith(("bind", "server engine"))]
    assert len(lines) == 3 and all(_ONE_WORD.match(ln) for ln in lines), lines
    escaped = payload.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("#", "\\#")
    # Backends are numbered in the names' order (core/proxy.py): the payload's is m1 or m2 by how it sorts.
    backend = "m1" if payload < "chat" else "m2"
    assert f'use_backend {backend} if {{ var(txn.model) -m str "{escaped}" }}' in config


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if (" " in p or "#" in p) and "\n" not in p])
def test_haproxy_refuses_a_quoted_address_with_a_directive(payload: str, tmp_path: Path) -> None:
    """Quoted, an address with a directive or a comment in it is a bad address to HAProxy, not a directive."""
    assert _haproxy_check(_render(payload, [Route("chat", "127.0.0.1", 8001)]), tmp_path).returncode != 0


@pytest.mark.parametrize("payload", ["0.0.0.0\n    bind 0.0.0.0:9999", "a\rb", "x\u2028y", "\u202e127.0.0.1"])
def test_template_refuses_a_line_break_in_any_value(payload: str) -> None:
    """A value that would end a config line is refused while rendering, naming the value."""
    with pytest.raises(RenderError, match="cannot be written into HAProxy's config"):
        _render("127.0.0.1", [Route(payload, "127.0.0.1", 8001)])


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "127.0.0.1", "localhost"])
def test_rendered_config_passes_haproxy_check(bind: str, tmp_path: Path) -> None:
    """A config with IPv4/IPv6 binds, IPv6 and named engines, gaps and routes passes real `haproxy -c`."""
    routes = [
        Route("chat", "::1", 8001),
        Route("code", "localhost", 8002),
        Route("org/m:v1@x+y", "127.0.0.1", 8003),
        Route("gap"),
    ]
    config = _render(bind, routes)
    done = _haproxy_check(config, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'server engine "[::1]:8001"' in config and '-m str "gap"' in config


@pytest.mark.parametrize("drain", [0.5, 0.001, 1e-05, 30, 3600])
def test_any_valid_drain_timeout_renders_a_config_haproxy_takes(drain: float, tmp_path: Path) -> None:
    """drain_timeout_s below a second or fractional becomes milliseconds HAProxy accepts."""
    done = _haproxy_check(_render("127.0.0.1", [Route("chat", "127.0.0.1", 8001)], drain_timeout_s=drain), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_engine_on_an_ipv6_address_is_reached_at_its_base_url() -> None:
    """A host address that is an IPv6 literal gives a bracketed URL the health probe can reach."""
    from orchestrator.adapters.http_health import HttpHealthProbe
    from orchestrator.core.records import UnitSpec

    server = Engine("::1", body=b'{"object":"list","data":[{"id":"chat"}]}').start()
    try:
        spec = UnitSpec(
            model="m",
            unit_name="vllm-m.service",
            unit_text="",
            unit_sha="",
            served_name="chat",
            address="::1",
            port=server.port,
            gpus=(0,),
            load_deadline_s=1,
            model_dir="/m",
        )
        assert spec.base_url == f"http://[::1]:{spec.port}"
        assert HttpHealthProbe().models(spec.base_url) == ["chat"]
    finally:
        server.close()
