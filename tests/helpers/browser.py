"""Headless Chromium for the playground's tests (Debian's `chromium` and `chromium-driver`, driven by Selenium), and
the screenshots they keep as CI artifacts: `artifacts/` at the repository's root (gitignored; `.ci/run` lists what
it holds when the stages end), or TXL_ARTIFACTS."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def artifacts() -> Path:
    """Where tests leave what CI keeps."""
    return Path(os.environ.get("TXL_ARTIFACTS") or ROOT / "artifacts")


def chromium(*extra_flags: str, size: tuple[int, int] = (1280, 900)) -> Iterator[Any]:
    """A headless Chromium window of `size` (a fixture's body: `yield from chromium()`); skips, saying why, where
    Chromium, its driver or Selenium is missing."""
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        f"--window-size={size[0]},{size[1]}",
        *extra_flags,
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (
            StaleElementReferenceException
        ):  # the page re-rendered an element between finding and reading it
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def open_playground(driver: Any, server: Any) -> Callable[[str], str]:
    """Opens the playground; returns `text_of(element_id)`, the text of the page's element of that id."""
    from selenium.webdriver.common.by import By

    driver.get(server.url + "/")
    return lambda element_id: driver.find_element(By.ID, element_id).text


def enter_key(driver: Any, key: str) -> None:
    """Types an API key into the page's key form and sends it."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#key-form button").click()


def screenshot(driver: Any, name: str) -> Path:
    folder = artifacts() / "playground"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def severe_errors(driver: Any, *expected: str) -> list[dict]:
    """The page's console errors, but for those naming an expected status (e.g. "401")."""
    return [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and not any(status in e["message"] for status in expected)
    ]
