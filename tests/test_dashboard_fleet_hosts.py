"""The fleet page of a controller's agent in headless chromium, during a rollout over 4 test hosts, each
in its own network namespace with its own agent (the pause hook in its engine) and the stand-in engine.

The controller's agent runs on this machine (tests/test_rollout_hosts.py's Controller: its own SSH key
reaches the boxes); `orchestrator dashboard` forwards its dashboard socket, as an operator opens it.
Batch 1's boxes are held in `starting` so the page is seen mid-batch: the canary switched, batch 1
switching with its phase, batch 2 pending; then every batch done and every box serving beta, with no
reload. A screenshot of the page mid-rollout is taken (docs/dashboard/fleet-rollout.png when
DASHBOARD_SHOTS=docs/dashboard)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.browser import chromium, screenshot, texts
from tests.builders.agent import HOOKS, PY, STATE
from tests.builders.switch import config_text
from tests.hosts.machine import Host
from tests.hosts.pool import HostSet
from tests.test_agent_hosts import install_agent
from tests.test_rollout_hosts import Controller, box_cli, box_models

pytestmark = pytest.mark.hosts


@pytest.fixture(scope="module")
def fleet(netns_fleet: HostSet) -> HostSet:
    """The session's four hosts in network namespaces (shared with the other modules of four boxes)."""
    return netns_fleet


@pytest.fixture
def controller(fleet: HostSet, tmp_path: Path) -> Iterator[Controller]:
    """Every box's own agent (with the pause hook) serving alpha; the controller's agent started here."""

    def serve_alpha(h: Host) -> None:
        (tmp_path / h.name).mkdir()
        install_agent(h, config_text(h, Path(STATE), box_models(), transport="local"), tmp_path / h.name)
        assert box_cli(h, "switch", "alpha").returncode == 0, h.name

    on_each(fleet.hosts, serve_alpha)
    ctl = Controller(fleet, tmp_path)
    ctl.start()
    try:
        yield ctl
    finally:
        for h in fleet.hosts:  # a test that failed mid-hold: the boxes go on, so the controller can stop
            h.run(f"rm -f {HOOKS}/pause-at", check=False)
        ctl.release()
        ctl.stop()
        on_each(fleet.hosts, stop_and_reset)


def on_each(hosts: list[Host], step: Callable[[Host], None]) -> None:
    """``step`` on every box at once (each box is its own machine: one at a time only adds up the waits)."""
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        for fut in [pool.submit(step, h) for h in hosts]:
            fut.result()


def stop_and_reset(host: Host) -> None:
    host.run("systemctl stop orchestrator-agent.service", check=False)
    host.reset()


@pytest.fixture
def forwarded(controller: Controller) -> Iterator[str]:
    """`orchestrator dashboard --no-open` here, reaching the controller's agent by its socket; its URL."""
    proc = subprocess.Popen(
        [PY, "-m", "orchestrator", "dashboard", "--no-open", "--config", str(controller.client_cfg)],
        env={**os.environ, "ORCHESTRATOR_SOCKET": controller.socket},
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


# One read of the page in its own script: atomic against the SSE updates that replace its sections.
SNAPSHOT = """
const q = (sel, f) => Object.fromEntries([...document.querySelectorAll(sel)].map(f));
const ro = document.querySelector("p.rollout");
return {status: ro ? ro.dataset.status : null, label: ro ? ro.querySelector(".label").textContent : "",
        hosts: q("table.rollout tr[data-host]", r => [r.dataset.host, r.querySelector("td.state").textContent]),
        batches: q("table.rollout tbody[data-batch]", b => [b.dataset.batch, b.dataset.state]),
        serving: q('table.boxes tr[data-reachable="true"]',
                   r => [r.dataset.host, r.querySelector("td.serving").textContent])};
"""


def page(driver: Any) -> dict[str, Any]:
    return dict(driver.execute_script(SNAPSHOT))


def serving(driver: Any) -> dict[str, str]:
    """The boxes table's serving column, read through the DOM API (works with JavaScript off)."""
    return {
        str(r.get_attribute("data-host")): r.find_element(By.CSS_SELECTOR, "td.serving").text
        for r in driver.find_elements(By.CSS_SELECTOR, 'table.boxes tr[data-reachable="true"]')
    }


def test_the_fleet_page_follows_a_rollout_batch_by_batch(
    fleet: HostSet, controller: Controller, forwarded: str, tmp_path: Path
) -> None:
    """The controller's dashboard opens on the fleet page; the rollout's batches and each box's state
    update live as the rollout goes; the tables are there with JavaScript off too."""
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(forwarded)
        wait = WebDriverWait(driver, 120)
        wait.until(lambda d: "live" in texts(d, "#updated")[0])
        assert driver.current_url.endswith("/fleet")
        driver.execute_script("window.loadedOnce = true")
        assert page(driver)["serving"] == dict.fromkeys(("h1", "h2", "h3", "h4"), "alpha")

        for h in fleet.hosts[1:3]:  # batch 1 (h2, h3) held before its engine starts
            h.write_file(f"{HOOKS}/pause-at", "starting")
        rollout = controller.popen("rollout", "beta")
        held = wait.until(
            lambda d: (
                (v := page(d))["hosts"].get("h2") == "switching (starting)" and v["serving"].get("h1") == "beta" and v
            )
        )
        assert held["hosts"]["h1"] == "switched" and held["hosts"]["h4"] == "pending"
        assert held["batches"] == {"0": "done", "1": "switching", "2": "pending"}
        assert held["label"] == "running: batch 1 switching"
        screenshot(driver, "fleet-rollout", tmp_path)

        for h in fleet.hosts[1:3]:
            h.run(f"rm -f {HOOKS}/pause-at")
        done = wait.until(
            lambda d: (
                (v := page(d))["status"] == "succeeded"
                and v["serving"] == dict.fromkeys(("h1", "h2", "h3", "h4"), "beta")
                and v
            )
        )
        assert done["batches"] == {"0": "done", "1": "done", "2": "done"}
        assert driver.execute_script("return window.loadedOnce") is True
        assert rollout.wait(timeout=120) == 0
    finally:
        driver.quit()

    static = chromium(tmp_path / "profile-nojs", javascript=False)
    try:
        static.get(forwarded)
        assert static.find_element(By.CSS_SELECTOR, "p.rollout").get_attribute("data-status") == "succeeded"
        assert serving(static) == dict.fromkeys(("h1", "h2", "h3", "h4"), "beta")
    finally:
        static.quit()
