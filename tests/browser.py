"""Debian's chromium, headless, driven by selenium through /usr/bin/chromedriver (nothing downloaded)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1800",
)


def chromium(profile: Path, *, javascript: bool = True) -> webdriver.Chrome:
    """A fresh browser with its own --user-data-dir; JavaScript off when asked (the tables must still work)."""
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    if not javascript:
        opts.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def texts(driver: Any, *selectors: str) -> tuple[str, ...]:
    """Each selector's element's rendered text ('' when absent), read in one script call: a live page redraws
    its sections on each update, so an element found by one WebDriver call can be gone when the next reads it."""
    found = driver.execute_script(
        "return arguments[0].map(s => { const e = document.querySelector(s); return e ? e.innerText.trim() : ''; })",
        list(selectors),
    )
    return tuple(str(t) for t in found)


def screenshot(driver: Any, name: str, tmp: Path) -> Path:
    """Save the page as NAME.png under $DASHBOARD_SHOTS (the docs' pictures: DASHBOARD_SHOTS=docs/dashboard)
    or else under the test's own tmp folder, so a test run leaves the checkout as it was."""
    folder = Path(os.environ.get("DASHBOARD_SHOTS") or tmp / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / f"{name}.png"))
    return folder / f"{name}.png"
