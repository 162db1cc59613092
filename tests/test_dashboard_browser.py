"""The dashboard in a real headless chromium, through the forwarder, against the agent in this process over
fake ports: the tables work with JavaScript off, the live page updates without a reload, charts draw."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from orchestrator.agent.daemon import Agent
from orchestrator.client.forward import Forwarder, unix_opener
from orchestrator.dashboard.service import start
from tests.browser import chromium, texts
from tests.unit.conftest import OpsWorld


@dataclass
class Site:
    world: OpsWorld
    fwd: Forwarder


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    world = OpsWorld(tmp_path / "state", dashboard={"socket": str(tmp_path / "dash.sock"), "refresh_s": 0.3})
    agent = Agent(world.catalog, world.ops, socket=str(tmp_path / "agent.sock"), metrics_port=None, clock=world.clock)
    server = start(agent)
    assert server is not None
    fwd = Forwarder(unix_opener(str(tmp_path / "dash.sock")))
    threading.Thread(target=fwd.serve_forever, daemon=True).start()
    yield Site(world, fwd)
    fwd.shutdown()
    fwd.server_close()
    server.close()


def state_of(driver: object, model: str) -> str:
    cell = driver.find_element(By.CSS_SELECTOR, f'table.models tr[data-model="{model}"] td.state')  # type: ignore[attr-defined]
    return str(cell.text)


def test_the_tables_work_with_javascript_off(site: Site, tmp_path: Path) -> None:
    """Without JavaScript the page still lists GPUs, models and history, server-rendered."""
    site.world.ops.switch("alpha")
    driver = chromium(tmp_path / "profile", javascript=False)
    try:
        driver.get(site.fwd.url)
        assert state_of(driver, "alpha") == "serving"
        holders = driver.find_element(By.CSS_SELECTOR, 'table.gpus tr[data-gpu="0"] td.holders').text
        assert holders.startswith("alpha (pid")
        assert (
            driver.find_element(By.CSS_SELECTOR, 'table.history tr[data-revision="1"]').get_attribute("data-outcome")
            == "active"
        )
    finally:
        driver.quit()


def test_the_live_page_follows_a_switch_without_a_reload(site: Site, tmp_path: Path) -> None:
    """A switch made after the page loaded shows up in the models and GPU tables through SSE."""
    site.world.ops.switch("alpha")
    driver = chromium(tmp_path / "profile")
    try:
        driver.get(site.fwd.url)
        driver.execute_script("window.loadedOnce = true")  # gone if the page reloads
        WebDriverWait(driver, 30).until(lambda d: "live" in texts(d, "#updated")[0])
        site.world.ops.switch("beta")

        # the models and GPU tables are separate parts of a frame: await them together, not one then a read
        def beta_took_over(d: Any) -> bool:
            beta, alpha, gpu0 = texts(
                d,
                'table.models tr[data-model="beta"] td.state',
                'table.models tr[data-model="alpha"] td.state',
                'table.gpus tr[data-gpu="0"] td.holders',
            )
            return (beta, alpha) == ("serving", "stopped") and gpu0.startswith("beta (pid")

        WebDriverWait(driver, 30).until(beta_took_over)
        assert driver.execute_script("return window.loadedOnce") is True
        # the downtime chart (uPlot) drew both switches that stopped a model
        WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '.chart[data-chart="downtime"] canvas')
        )
    finally:
        driver.quit()
