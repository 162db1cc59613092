"""The dashboard of a real agent (a systemd unit in a test host, the stand-in engine), opened the way an
operator opens it: `orchestrator --host BOX dashboard` on this machine, over SSH, in headless chromium.

The GPU table, the models and the running switch's timeline update as the switch goes (the engine held
before a phase by the test hook); screenshots of the box page mid-switch and of a tune comparison are
taken (docs/dashboard/ when DASHBOARD_SHOTS=docs/dashboard). The Grafana dashboard's queries are checked
against this agent's /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import chromium, screenshot, texts
from tests.hosts.machine import Host
from tests.hosts.wait import wait_for
from tests.test_agent_hosts import HOOKS, STATE, cli, install_agent, metrics
from tests.test_switch_hosts import MODELS, config_text
from tests.test_tune_hosts import BENCH, TINY, TINY_ENV, put_tiny
from tests.test_warm_hosts import warm_config

pytestmark = pytest.mark.hosts

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "orchestrator" / "dashboard" / "grafana.json"
PY = sys.executable


@pytest.fixture
def box(hosts: list[Host], tmp_path: Path) -> Iterator[Host]:
    """h1 runs the agent (dashboard on by default) for itself; a hosts file here names it `box`."""
    host = hosts[0]
    put_tiny(host)
    models = {"alpha": MODELS["alpha"], "beta-long": MODELS["beta-long"], "gamma": MODELS["gamma"], "tiny": TINY}
    install_agent(host, config_text(host, Path(STATE), models, transport="local") + TINY_ENV, tmp_path)
    write_hosts_file(host, tmp_path)
    wait_for(
        lambda: host.run(["test", "-S", f"{STATE}/dashboard.sock"], check=False).returncode == 0,
        what="the agent's dashboard socket",
    )
    yield host
    host.run(f"rm -f {HOOKS}/pause-at; systemctl stop orchestrator-agent.service", check=False)


def write_hosts_file(host: Host, tmp_path: Path) -> None:
    """A hosts file here that names ``host`` `box` (what `--host box` reaches over SSH)."""
    (tmp_path / "hosts.toml").write_text(
        f'[box]\nurl = "ssh://root@{host.address}:{host.port}"\nkey = "{host.key_path}"\n'
        f'known_hosts = "{host.known_hosts_path}"\npython = "{PY}"\nsocket = "{STATE}/agent.sock"\n'
    )


@pytest.fixture
def forwarded(box: Host, tmp_path: Path) -> Iterator[str]:
    """`orchestrator --host box dashboard --no-open` running here; the URL it printed."""
    with forward(tmp_path) as url:
        yield url


@contextmanager
def forward(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "ORCHESTRATOR_HOSTS_FILE": str(tmp_path / "hosts.toml")}
    proc = subprocess.Popen(
        [PY, "-m", "orchestrator", "--host", "box", "dashboard", "--no-open"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    try:
        assert url.startswith("http://127.0.0.1:"), url + (proc.stderr.read() if proc.stderr else "")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def state_of(driver: Any, model: str) -> str:
    return texts(driver, f'table.models tr[data-model="{model}"] td.state')[0]


def holders(driver: Any, gpu: int) -> str:
    return texts(driver, f'table.gpus tr[data-gpu="{gpu}"] td.holders')[0]


NEWEST_ROW = """
const row = document.querySelector("table.history tbody tr");
return row && {outcome: row.dataset.outcome, text: row.innerText, phases: row.querySelector("td.phases").innerText};
"""


def test_the_box_page_follows_a_switch_as_it_goes(box: Host, forwarded: str, tmp_path: Path) -> None:
    """Through SSH: the switch's phases appear live while the engine is held, the GPUs empty and fill,
    and the models table and history end with the new model serving; no reload."""
    cli(box, "switch", "alpha")
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(forwarded)
        wait = WebDriverWait(driver, 60, ignored_exceptions=[StaleElementReferenceException])  # a section redrawn
        wait.until(lambda d: "live" in texts(d, "#updated")[0])
        driver.execute_script("window.loadedOnce = true")
        assert state_of(driver, "alpha") == "serving" and holders(driver, 0).startswith("alpha (pid")

        box.write_file(f"{HOOKS}/pause-at", "starting")
        switch = threading.Thread(target=cli, args=(box, "switch", "beta-long"), daemon=True)
        switch.start()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, 'ol.timeline li.current[data-phase="starting"]'))
        # Read in a wait: the page may redraw the timeline between finding its items and reading them.
        phases = wait.until(
            lambda d: [e.get_attribute("data-phase") for e in d.find_elements(By.CSS_SELECTOR, "ol.timeline li")]
        )
        assert phases[:3] == ["planned", "preflight", "staging"] and "freeing" in phases
        # The models table comes from the agent's status, read before the timeline in each update: the
        # update that first shows `starting` may carry the status of a moment before (the switch is
        # held at starting, so the next update shows it).
        wait.until(
            lambda d: (
                (state_of(d, "beta-long"), state_of(d, "alpha"))
                == ("switching (starting)", "stopped (replaced by beta-long)")
            ),
            "the models table to show beta-long starting and alpha replaced",
        )
        wait.until(lambda d: holders(d, 0) == "free")  # alpha's engine is gone from GPU 0
        screenshot(driver, "box-during-switch", tmp_path)

        box.run(f"rm -f {HOOKS}/pause-at")
        wait.until(lambda d: state_of(d, "beta-long") == "serving")
        switch.join(timeout=120)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#h0-operation p.idle"))
        assert holders(driver, 0).startswith("beta-long (pid")
        # History is read before the running operation in each update: the first idle one may list the
        # switch before its outcome was written.
        newest = wait.until(
            lambda d: (row := d.execute_script(NEWEST_ROW)) and row["outcome"] == "active" and row,
            "the newest history row to end active",
        )  # one read: the page redraws on each update
        assert newest["outcome"] == "active" and "beta-long" in newest["text"]
        assert "start" in newest["phases"]
        assert driver.execute_script("return window.loadedOnce") is True
        screenshot(driver, "box-after-switch", tmp_path)
    finally:
        driver.quit()


def test_the_tune_page_compares_the_candidates(box: Host, forwarded: str, tmp_path: Path) -> None:
    """A tune run on the box shows as a table and a chart of every candidate, the winner marked."""
    cli(box, "switch", "alpha")
    report = json.loads(cli(box, "tune", "tiny", "--layouts", "tp2,tp4,tp8", *BENCH, "--json").stdout)
    winner = report["decision"]["winner"]
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(forwarded)
        driver.get(forwarded.split("?")[0] + "tune")
        assert driver.find_element(By.ID, "winner").text == winner
        row = driver.find_element(By.CSS_SELECTOR, "table.tune tr.winner")
        assert row.get_attribute("data-candidate") == "tp4"
        failed = driver.find_element(By.CSS_SELECTOR, 'table.tune tr[data-candidate="tp8"] td.error').text
        assert "192" in failed  # the engine's own line: why TP=8 cannot load
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, '.chart[data-chart="tune"] canvas'))
        screenshot(driver, "tune-comparison", tmp_path)
        driver.get(forwarded.split("?")[0])  # the box page compares the candidates' benchmarks too
        assert driver.find_elements(By.CSS_SELECTOR, 'table.bench tr[data-model="tiny.tp4"]')
        WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '.chart[data-chart="bench_tok_s"] canvas')
        )
    finally:
        driver.quit()


def test_a_box_user_outside_the_socket_group_gets_403(box: Host) -> None:
    """On the box, a local user who is not in the socket group is answered 403 by the dashboard socket;
    once in the group, the page (the state dir is opened to others for this check: normally a stranger
    cannot even reach the socket)."""
    box.run(
        "id dashguest >/dev/null 2>&1 || useradd --no-create-home dashguest; "
        "gpasswd -d dashguest orchestrator >/dev/null 2>&1 || true"
    )
    box.run(f"chmod g+rx,o+x {STATE}")
    get = [
        "runuser",
        "-u",
        "dashguest",
        "--",
        "curl",
        "-sS",
        "-i",
        "--unix-socket",
        f"{STATE}/dashboard.sock",
        "http://box/",
    ]
    out = box.run(get).stdout
    assert out.startswith("HTTP/1.1 403") and "may not use the dashboard" in out and "'orchestrator'" in out
    assert "<table" not in out
    box.run("usermod -a -G orchestrator dashguest")
    assert box.run(get).stdout.startswith("HTTP/1.1 200")


def test_a_stopped_agent_is_a_502_naming_the_socket_not_an_empty_page(box: Host, forwarded: str) -> None:
    """The agent went away after the CLI started: the relay's reason reaches the browser as a 502."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    assert opener.open(forwarded, timeout=30).status == 200
    box.run("systemctl stop orchestrator-agent.service")
    with pytest.raises(urllib.error.HTTPError) as err:
        opener.open(forwarded.split("?")[0], timeout=60)
    assert err.value.code == 502
    why = err.value.read().decode()
    assert f"{STATE}/dashboard.sock: no agent is running there" in why, why


def test_the_agent_opens_no_tcp_port_but_its_metrics_on_loopback(box: Host) -> None:
    """No page or endpoint of the dashboard is reachable from another address: the agent listens on TCP
    only for Prometheus, on 127.0.0.1; the dashboard is a Unix socket."""
    pid = box.run(["systemctl", "show", "-p", "MainPID", "--value", "orchestrator-agent"]).stdout.strip()
    listening = box.run(["ss", "-H", "-l", "-n", "-p", "-t"]).stdout.splitlines()
    ours = [line.split()[3] for line in listening if f"pid={pid}," in line]
    assert len(ours) == 1 and ours[0].startswith("127.0.0.1:"), listening
    unix = box.run(["ss", "-H", "-l", "-x", "-p"]).stdout
    assert f"{STATE}/dashboard.sock" in unix


def metric_names(text: str) -> set[str]:
    """Every name a PromQL query may use against this exposition: samples, and each family's series
    names even before a first sample (_total, _bucket, _sum, _count)."""
    names: set[str] = set()
    for fam in text_string_to_metric_families(text):
        names.add(fam.name)
        names.update(s.name for s in fam.samples)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(fam.type, [])
        names.update(fam.name + s for s in suffixes)
    return names


def test_every_metric_of_the_grafana_dashboard_is_exported_by_the_agent(box: Host) -> None:
    """After a switch, every orchestrator_* metric the Grafana JSON queries is in the agent's /metrics."""
    cli(box, "switch", "alpha")
    dash = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][0]["query"]["query"])
    wanted = {m for e in exprs for m in re.findall(r"\borchestrator_[a-z0-9_]+", e)}
    assert len(wanted) >= 7
    exported = metric_names(metrics(box))
    assert wanted <= exported, f"queried but not exported: {sorted(wanted - exported)}"


ASLEEP_VIEW = """
const held = document.querySelector("p.sleep");
return {budget: held.dataset.budget, held: held.dataset.held, text: held.innerText,
        ram: document.querySelector('table.models tr[data-model="alpha"] td.ram').innerText.trim(),
        residue: [...document.querySelectorAll('table.gpus tr[data-gpu="0"] span.proc.asleep')]
                 .map(e => e.dataset.model)};
"""


def test_the_box_page_shows_an_asleep_model_with_its_ram_and_gpu_residue(hosts: list[Host], tmp_path: Path) -> None:
    """Warm switches on a real agent: after alpha then beta, alpha is asleep (level 1) in the models
    table, the host RAM its weights hold is what counts against the budget, and its engine's residue on
    the GPUs is named as alpha's, asleep."""
    host = hosts[0]
    config = warm_config(host, Path(STATE)).replace('transport = "ssh"', 'transport = "local"', 1)
    install_agent(host, only_models(config, ("alpha", "beta")), tmp_path)
    write_hosts_file(host, tmp_path)
    try:
        cli(host, "switch", "alpha")
        cli(host, "switch", "beta")
        with forward(tmp_path) as url:
            driver = chromium(tmp_path / "profile")
            try:
                driver.get(url)
                wait = WebDriverWait(driver, 60)
                wait.until(lambda d: "live" in texts(d, "#updated")[0])
                assert (state_of(driver, "alpha"), state_of(driver, "beta")) == ("asleep", "serving")
                cell = 'table.models tr[data-model="{}"] td.residency'
                assert texts(driver, cell.format("alpha"), cell.format("beta")) == ("asleep (level 1)", "awake")
                view = driver.execute_script(ASLEEP_VIEW)  # one read: the page redraws on each update
                assert float(view["budget"]) == 8.0
                # the weights' size on the box (du): none here (source "none"), so the stand-in holds 0.0
                assert float(view["held"]) == float(view["ram"]) and "of 8.0 GiB" in view["text"]
                assert "asleep: alpha" in view["text"]
                assert view["residue"] == ["alpha"]
                screenshot(driver, "box-asleep", tmp_path)
            finally:
                driver.quit()
    finally:
        host.run(
            "systemctl stop orchestrator-agent.service orchestrator-proxy.service; "
            "rm -f /etc/orchestrator/haproxy.cfg*",
            check=False,
        )


def only_models(config: str, models: tuple[str, ...]) -> str:
    """The config without the [models.*] sections not named."""
    out, skip = [], False
    for line in config.splitlines(keepends=True):
        if line.startswith("["):
            skip = line.startswith("[models.") and line.strip()[len("[models.") : -1] not in models
        if not skip:
            out.append(line)
    return "".join(out)
