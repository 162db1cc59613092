"""`config push` reloads the front proxy at once for any change to what it is rendered from ([proxy]
settings, the bind), not only for a change to what it holds on demand; a push that changes none of it
leaves the proxy alone; one that sets [proxy] enabled = false stops it, one that sets it back starts
it. The agent's real config-push path over a fake host and proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.proxy import body_limit
from orchestrator.deploy.locks import host_lock
from tests.unit.test_demand_push import Pushed


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Pushed]:
    """An agent with no model on demand, b switched in through the proxy."""
    world = Pushed(tmp_path, on_demand=False)
    world.agent.demand.sync()
    switched = list(world.agent.dispatch("switch", {"model": "b"}, "alice@test"))
    assert switched[-1]["result"]["outcome"] == "active"
    yield world
    world.agent.stop()
    world.agent.demand.stop()


def _with_proxy(world: Pushed, lines: str) -> str:
    return world.text(on_demand=False).replace("port = 9000\n", "port = 9000\n" + lines, 1)


@pytest.mark.parametrize(
    "lines,rendered",
    [
        ("drain_timeout_s = 45\n", "hard-stop-after 45000ms"),
        ("retry_after_s = 9\n", "hdr Retry-After 9 "),
        ('user = "nobody"\n', 'user "nobody"'),
    ],
)
def test_a_push_of_a_proxy_setting_alone_reloads_the_proxy_at_once(serving: Pushed, lines: str, rendered: str) -> None:
    """No model on demand: a push changing only [proxy] reloads HAProxy with it now, b still routed."""
    before = len(serving.proxy.applied)
    assert rendered not in (serving.proxy.config or "")
    result = serving.push(_with_proxy(serving, lines), uid=0)[-1]["result"]  # root: [proxy] user is root-only
    assert result["proxy"] == {"box": "reloaded"} and len(serving.proxy.applied) == before + 1
    assert rendered in (serving.proxy.config or "") and '"127.0.0.9:8002"' in (serving.proxy.config or "")


def test_a_push_that_moves_the_default_bind_reloads_the_proxy(serving: Pushed) -> None:
    """[defaults] bind is where the proxy listens when neither [proxy] nor the host says: reloaded at once."""
    text = serving.text(on_demand=False).replace("[proxy]\n", '[defaults]\nbind = "127.0.0.10"\n[proxy]\n', 1)
    result = serving.push(text, uid=0)[-1]["result"]
    assert result["proxy"] == {"box": "reloaded"} and '"127.0.0.10:9000"' in (serving.proxy.config or "")


def test_a_push_that_raises_a_models_max_model_len_reloads_the_proxy_with_the_larger_buffer(serving: Pushed) -> None:
    """The body routing reads derives from the host's max_model_len: a push raising it reloads HAProxy at once."""
    text = serving.text(on_demand=False, extra="max_model_len = 1048576\n")
    result = serving.push(text)[-1]["result"]
    assert result["proxy"] == {"box": "reloaded"}
    assert f"tune.bufsize {body_limit([1_048_576]).bufsize}\n" in (serving.proxy.config or "")


def test_a_push_that_changes_nothing_the_proxy_is_rendered_from_leaves_it(serving: Pushed) -> None:
    """A model's setting the proxy does not render (its gpu_memory_utilization): no reload, no proxy key."""
    before = len(serving.proxy.applied)
    text = serving.text(on_demand=False, extra="gpu_memory_utilization = 0.8\n")
    assert "proxy" not in serving.push(text)[-1]["result"]
    assert len(serving.proxy.applied) == before


def _disabled(world: Pushed) -> str:
    return world.text(on_demand=False).replace("enabled = true\n", "enabled = false\n", 1)


def test_a_push_that_disables_the_proxy_stops_it_and_says_so(serving: Pushed) -> None:
    """[proxy] enabled = false stops the proxy, the push's answer says so, and an event records it."""
    result = serving.push(_disabled(serving))[-1]["result"]
    assert result["proxy"]["box"].startswith("stopped: [proxy] enabled = false")
    assert serving.proxy.stops == 1 and serving.proxy.config is None
    stopped = serving.agent.ops.store.events(kind="proxy_stopped")
    assert [e["was_running"] for e in stopped] == [True]


def test_a_push_that_enables_the_proxy_again_starts_it_with_the_serving_routes(serving: Pushed) -> None:
    """Off, then enabled = true again: the proxy starts at once, routing b, which still serves."""
    serving.push(_disabled(serving))
    result = serving.push(serving.text(on_demand=False))[-1]["result"]
    assert result["proxy"] == {"box": "started"}
    assert '"127.0.0.9:8002"' in (serving.proxy.config or "")


def test_a_push_that_keeps_the_proxy_off_leaves_it_alone(serving: Pushed) -> None:
    """Off, then a push of another setting with the proxy still off: nothing stopped twice, no proxy key."""
    serving.push(_disabled(serving))
    result = serving.push(_disabled(serving).replace("port = 8001\n", "port = 8011\n", 1))[-1]["result"]
    assert "proxy" not in result and serving.proxy.stops == 1


def test_a_disabling_push_while_another_process_holds_the_hosts_lock_says_the_proxy_still_runs(serving: Pushed) -> None:
    """A CLI holds box's lock: the push lands, the proxy keeps running, the answer says why and how to stop it."""
    with host_lock(str(serving.tmp / "state"), "box"):
        result = serving.push(_disabled(serving))[-1]["result"]
    assert result["changed"] and result["proxy"]["box"].startswith("not stopped: host box is busy")
    assert "systemctl disable --now orchestrator-proxy.service" in result["proxy"]["box"]
    assert serving.proxy.stops == 0 and serving.proxy.config is not None
