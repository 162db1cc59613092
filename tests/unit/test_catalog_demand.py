"""deploy.toml's models-on-demand settings: `on_demand`, the idle policy, `priority`, `queue_limit`,
`demand_deadline_s`, `[demand]` and `[proxy] demand_socket`; bad input exits 2 naming key and value."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.catalog import Catalog
from tests.builders.toml import Template

from .cli_runner import invoke

BASE = """
state_dir = "/var/lib/orchestrator"
[defaults]
bind = "127.0.0.1"
load_deadline_s = 600
wake_deadline_s = 20
[hosts.box]
address = "127.0.0.1"
gpus = 8
gpu_memory_gib = 141
[proxy]
enabled = {proxy}
port = 9000
{proxy_rest}
[models.a]
repo = "org/a"
gpus = [0]
port = 8001
on_demand = true
{model}
[models.b]
repo = "org/b"
gpus = [0]
port = 8002
{rest}
"""


DOC = Template(BASE, {"proxy": "true"})
load, refused = DOC.load, DOC.refused


def test_defaults_keep_an_on_demand_model_awake_and_the_box_calm(tmp_path: Path) -> None:
    """Unset: no idle sleep or stop, no minimum awake time, priority 0, 64 waiting, 6 swaps a minute."""
    cat = load(tmp_path)
    a, b = cat.models["a"], cat.models["b"]
    assert (a.on_demand, a.idle_sleep_s, a.idle_stop_s, a.min_awake_s, a.priority, a.queue_limit) == (
        True,
        None,
        None,
        0.0,
        0,
        64,
    )
    assert (b.on_demand, cat.demand.max_swaps_per_min, cat.demand.batch_wait_s) == (False, 6, 2.0)


def test_the_idle_policy_and_limits_load_as_given(tmp_path: Path) -> None:
    """Every on-demand key and the [demand] section load as written."""
    cat = load(
        tmp_path,
        model='sleep = "level1"\nidle_sleep_s = 60\nidle_stop_s = 600\nmin_awake_s = 30\n'
        "priority = 5\nqueue_limit = 8\ndemand_deadline_s = 45",
        rest="[demand]\nmax_swaps_per_min = 3\nbatch_wait_s = 0.5",
    )
    a = cat.models["a"]
    assert (a.idle_sleep_s, a.idle_stop_s, a.min_awake_s, a.priority, a.queue_limit, a.demand_deadline_s) == (
        60,
        600,
        30,
        5,
        8,
        45,
    )
    assert (cat.demand.max_swaps_per_min, cat.demand.batch_wait_s) == (3, 0.5)


def test_the_deadline_defaults_to_the_wake_or_load_deadline_plus_the_batching_bound(tmp_path: Path) -> None:
    """Asleep: wake_deadline_s + batch_wait_s; stopped (or no sleep mode): load_deadline_s + batch_wait_s."""
    cat = load(tmp_path, model='sleep = "level1"', rest="[demand]\nbatch_wait_s = 1.5")
    assert (cat.demand_deadline("a", cold=False), cat.demand_deadline("a", cold=True)) == (21.5, 601.5)
    plain = load(tmp_path)
    assert plain.demand_deadline("a", cold=False) == 602.0


def test_an_explicit_deadline_wins(tmp_path: Path) -> None:
    """demand_deadline_s holds whatever the model's state."""
    cat = load(tmp_path, model='sleep = "level2"\ndemand_deadline_s = 45')
    assert (cat.demand_deadline("a", cold=False), cat.demand_deadline("a", cold=True)) == (45, 45)


def test_the_socket_defaults_to_run_orchestrator_outside_the_state_dir(tmp_path: Path) -> None:
    """/run/orchestrator/demand.sock (HAProxy's user cannot pass the 0750 state dir) unless [proxy]
    demand_socket names another."""
    assert load(tmp_path).demand_socket() == "/run/orchestrator/demand.sock"
    assert (
        load(tmp_path, proxy_rest='demand_socket = "/srv/demand/agent.sock"').demand_socket()
        == "/srv/demand/agent.sock"
    )


@pytest.mark.parametrize("path", ["run/demand.sock", "/run/../etc/demand.sock", "/run/demand", "/run/x y.sock"])
def test_a_bad_socket_path_is_refused(tmp_path: Path, path: str) -> None:
    """A relative path, '..', no .sock or a space: exit 2 naming the key and the value."""
    message = refused(tmp_path, proxy_rest=f'demand_socket = "{path}"')
    assert "proxy.demand_socket" in message and path in message


def test_idle_stop_before_idle_sleep_is_refused(tmp_path: Path) -> None:
    """idle_stop_s < idle_sleep_s: exit 2 naming both values."""
    message = refused(tmp_path, model='sleep = "level1"\nidle_sleep_s = 300\nidle_stop_s = 60')
    assert "models.a.idle_stop_s" in message and "idle_stop_s 60 is less than idle_sleep_s 300" in message


def test_idle_sleep_on_a_model_without_sleep_mode_is_refused(tmp_path: Path) -> None:
    """idle_sleep_s needs sleep mode: exit 2 naming the key, the value and the way out."""
    message = refused(tmp_path, model="idle_sleep_s = 60")
    assert "models.a.idle_sleep_s" in message and "idle_sleep_s = 60" in message and "idle_stop_s" in message


def test_idle_stop_alone_is_fine_without_sleep_mode(tmp_path: Path) -> None:
    """A model without sleep mode may still be stopped when idle."""
    assert load(tmp_path, model="idle_stop_s = 120").models["a"].idle_stop_s == 120


def test_on_demand_without_the_proxy_is_refused(tmp_path: Path) -> None:
    """The proxy holds the requests: on_demand with [proxy] enabled = false exits 2 naming both."""
    message = refused(tmp_path, proxy="false")
    assert "models.a.on_demand" in message and "[proxy] enabled = true" in message


def test_on_demand_on_a_multinode_model_is_refused(tmp_path: Path) -> None:
    """A model across boxes cannot be started by a request: exit 2 naming it."""
    rest = (
        '[hosts.box2]\naddress = "127.0.0.2"\ngpus = 8\n[models.big]\nrepo = "org/big"\nnodes = ["box", "box2"]\n'
        "gpus = [2]\npipeline_parallel = 2\nport = 8050\non_demand = true\n"
    )
    message = refused(tmp_path, model='host = "box"', rest='host = "box"\n' + rest)
    assert "models.big.on_demand" in message and "multi-node" in message and "box, box2" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("idle_stop_s", "60"),
        ("priority", "3"),
        ("queue_limit", "4"),
        ("min_awake_s", "10"),
        ("demand_deadline_s", "30"),
    ],
)
def test_demand_keys_without_on_demand_are_refused(tmp_path: Path, key: str, value: str) -> None:
    """An idle or queue key on a model that is not on demand would do nothing: exit 2 naming it."""
    message = refused(tmp_path, rest=f"{key} = {value}")
    assert f"models.b.{key}" in message and f"{key} = {value}" in message and "on_demand = true" in message


def test_a_catalog_read_back_from_its_own_dump_loads(tmp_path: Path) -> None:
    """A dump sets every demand key to its default: that is not asking for on-demand behaviour."""
    catalog = load(tmp_path)
    assert Catalog.model_validate(catalog.model_dump()).models.keys() == catalog.models.keys()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("queue_limit = 0", "models.a.queue_limit"),
        ("priority = 5000", "models.a.priority"),
        ("min_awake_s = -1", "models.a.min_awake_s"),
        ("idle_sleep_s = 0", "models.a.idle_sleep_s"),
    ],
)
def test_values_out_of_range_are_refused(tmp_path: Path, text: str, key: str) -> None:
    """A queue of 0, a priority past 1000, a negative time: exit 2 naming the key."""
    message = refused(tmp_path, model='sleep = "level1"\n' + text)
    assert key in message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("max_swaps_per_min = 0", "demand.max_swaps_per_min"),
        ("batch_wait_s = -1", "demand.batch_wait_s"),
        ("swaps = 3", "demand.swaps"),
    ],
)
def test_bad_demand_section_values_are_refused(tmp_path: Path, text: str, key: str) -> None:
    """[demand] with a zero cap, a negative wait or an unknown key: exit 2 naming the key."""
    assert key in refused(tmp_path, rest="[demand]\n" + text)


def test_the_cli_exits_2_naming_the_file_key_and_value(tmp_path: Path) -> None:
    """Through the real CLI: idle_stop_s < idle_sleep_s exits 2 with one line naming the file and key."""
    path = DOC.write(tmp_path, model='sleep = "level1"\nidle_sleep_s = 300\nidle_stop_s = 60')
    r = invoke("plan", "--config", str(path), "a")
    assert r.exit_code == 2
    assert f"{tmp_path / 'deploy.toml'}: models.a.idle_stop_s: idle_stop_s 60 is less than idle_sleep_s 300" in r.output


def test_an_on_demand_model_sharing_its_served_name_is_refused(tmp_path: Path) -> None:
    """A request names a served name: two models serving "chat" on one host leave it ambiguous: exit 2."""
    message = refused(tmp_path, model='served_name = "chat"', rest='served_name = "chat"')
    assert "models.a.on_demand" in message and "model b serves the same name 'chat'" in message
