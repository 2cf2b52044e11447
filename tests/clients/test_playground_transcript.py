"""The playground in a real headless Chromium, as a newcomer met it: its transcript after a reload that follows a
Regenerate, a History click or a Fork (rebuilt, naming the session shown), its settings across a reload, Stop,
tints told apart, the transcript in view on a 900-pixel window, what the bundled model is, and a generation that
waits beside long work saying so. Screenshots go to artifacts/playground/ (tests/helpers/browser.py)."""

from __future__ import annotations

import re

import pytest
from txl_client import Client
from txl_server.settings import BUNDLED_MODEL_DIR

from tests.helpers.browser import chromium, enter_key, open_playground, screenshot, severe_errors, wait_for
from tests.helpers.gate import Gate
from tests.helpers.live_server import LiveServer
from tests.helpers.long_work import beside_long_work

from .conftest import API_KEY, server_settings

pytestmark = pytest.mark.browser

SETTINGS = {"max-tokens": "12", "temperature": "0.9", "top-k": "5", "top-p": "0.9", "seed": "7"}


@pytest.fixture
def browser():
    yield from chromium()


@pytest.fixture
def sdk(server):
    with Client(server.url, API_KEY) as client:
        yield client


@pytest.fixture(scope="module")
def bundled_server(redis_server):
    """The bundled model, as the README serves it (no key)."""
    with LiveServer(server_settings(BUNDLED_MODEL_DIR, redis_server.url)) as live:
        yield live


def by_id(driver, element_id):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def fill(driver, values: dict[str, str]) -> None:
    for element_id, value in values.items():
        field = by_id(driver, element_id)
        field.clear()
        field.send_keys(value)


def transcript(driver) -> list[tuple[str, str]]:
    from selenium.webdriver.common.by import By

    pieces = driver.find_elements(By.CSS_SELECTOR, "#transcript > span:not(.placeholder)")
    return [(p.get_attribute("class"), p.get_attribute("textContent")) for p in pieces]


def fresh_page(driver, server):
    """The playground as a first visit finds it (nothing kept), with the key entered; returns `text_of`."""
    text_of = open_playground(driver, server)
    driver.execute_script("localStorage.clear()")
    enter_key(driver, API_KEY)
    wait_for(lambda: text_of("model") == "tiny-byte", what="the model name")
    return text_of


def generate(driver, text_of, prompt: str, version: int) -> None:
    by_id(driver, "prompt").send_keys(prompt)
    by_id(driver, "generate").click()
    wait_for(lambda: text_of("session-version") == str(version), what=f"version {version}")


def reload(driver, text_of, session_id: str) -> None:
    driver.refresh()
    wait_for(lambda: text_of("session-id") == session_id, what="the session after the reload")
    wait_for(lambda: transcript(driver), what="the transcript after the reload")


def test_a_reload_after_regenerate_history_or_fork_shows_the_session_and_its_text(server, browser, sdk):
    driver = browser
    text_of = fresh_page(driver, server)
    fill(driver, SETTINGS)
    generate(driver, text_of, "The sea", 2)  # a conversation's session: created (v1), then generated on
    generate(driver, text_of, " Then", 3)
    session_id = text_of("session-id")
    assert not by_id(driver, "model-note").is_displayed()  # a model of the tests' own, not the bundled one

    # ---- the settings survive a reload
    driver.refresh()
    wait_for(lambda: text_of("session-id") == session_id, what="the session again")
    assert {k: by_id(driver, k).get_attribute("value") for k in SETTINGS} == SETTINGS

    # ---- Regenerate (a rewind, then the same text sampled again), then a reload: the text is back
    by_id(driver, "regenerate").click()
    wait_for(lambda: text_of("session-version") == "5", what="the regeneration")
    regenerated = transcript(driver)
    assert [c for c, _ in regenerated] == ["prompt", "generated", "prompt", "generated"]
    reload(driver, text_of, session_id)
    assert transcript(driver) == regenerated
    assert "earlier visit" not in text_of("transcript")
    screenshot(driver, "reload-after-regenerate.png")

    # ---- a History click back to version 2, then a reload: version 2's text
    wait_for(
        lambda: driver.find_elements("css selector", "#history button[data-version='2']"), what="history"
    )
    driver.find_element("css selector", "#history button[data-version='2']").click()
    wait_for(lambda: text_of("session-version") == "6", what="the rewind")
    assert transcript(driver) == regenerated[:2]
    reload(driver, text_of, session_id)
    assert transcript(driver) == regenerated[:2]
    assert sdk.get_session(session_id).version == 6

    # ---- Fork, then a reload: the fork is named, with the same text
    by_id(driver, "fork").click()
    wait_for(lambda: text_of("session-id") not in ("", session_id), what="the fork")
    fork_id = text_of("session-id")
    assert fork_id in text_of("gen-status") and session_id in text_of("gen-status")
    reload(driver, text_of, fork_id)
    assert transcript(driver) == regenerated[:2]
    assert session_id not in text_of("transcript")  # nothing names the session it came from as the one shown
    assert driver.execute_script("return localStorage.getItem('txl.sessionId')") == fork_id
    screenshot(driver, "reload-after-fork.png")

    # ---- a session this browser did not write: the end of its text, as the server keeps it, and its name
    elsewhere = sdk.create_session(text="Written by another client. The tide turned at noon.")
    driver.execute_script("localStorage.setItem('txl.sessionId', arguments[0])", elsewhere.id)
    reload(driver, text_of, elsewhere.id)
    assert transcript(driver) == [("earlier", "…Written by another client. The tide turned at noon.")]
    assert elsewhere.id in text_of("gen-status")
    assert not severe_errors(driver, "401")


def test_stop_adds_nothing_and_the_tints_tell_yours_from_the_models(server, browser, sdk):
    driver = browser
    text_of = fresh_page(driver, server)
    fill(driver, {"max-tokens": "8", "temperature": "0"})
    generate(driver, text_of, "Tides", 2)
    before = transcript(driver)
    session_id = text_of("session-id")

    # ---- Stop: the stream ends, nothing is committed, the text is as it was
    fill(driver, {"max-tokens": "200"})
    runner = server.app.state.runtime.service.worker.runner
    with Gate(runner, "run", delay=0.1):
        by_id(driver, "prompt").send_keys(" and more")
        by_id(driver, "generate").click()
        wait_for(lambda: "tokens/s" in text_of("gen-status"), what="tokens streaming")
        by_id(driver, "stop").click()
        wait_for(lambda: text_of("gen-status").startswith("stopped"), what="the stop")
    assert text_of("gen-status") == "stopped — nothing was added to the session"
    assert transcript(driver) == before
    assert sdk.get_session(session_id).version == 2 and text_of("session-version") == "2"

    # ---- tints: yours and the model's told apart, and both from the page
    def rgb(selector: str) -> tuple[int, ...]:
        color = driver.find_element("css selector", selector).value_of_css_property("background-color")
        return tuple(int(c) for c in color[color.index("(") + 1 : color.index(")")].split(",")[:3])

    def distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
        return sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) ** 0.5

    yours, models, page = rgb("#transcript .prompt"), rgb("#transcript .generated"), rgb("#transcript")
    assert distance(yours, models) >= 40, (yours, models)  # they were 18 apart
    assert min(distance(yours, page), distance(models, page)) >= 30, (yours, models, page)
    screenshot(driver, "tints-and-stop.png")


def test_a_generation_waiting_beside_long_work_says_so(server, browser, sdk):
    driver = browser
    text_of = fresh_page(driver, server)
    fill(driver, {"max-tokens": "2"})
    with beside_long_work(server, sdk):
        by_id(driver, "prompt").send_keys("The sea")
        by_id(driver, "generate").click()
        said = wait_for(
            lambda: (
                re.search(
                    r"the server is running (1 request, \d+ more waiting|[2-9] requests)",
                    text_of("gen-status"),
                )
                and text_of("gen-status")
            ),
            what="the page to say what the generation waits beside",
        )
        screenshot(driver, "waiting-beside-long-work.png")
    assert said.startswith("waiting for"), said
    wait_for(lambda: "finished" in text_of("gen-status"), what="the generation to finish")


def test_on_a_900_pixel_window_ctrl_enter_keeps_the_transcript_in_view(bundled_server):
    """The README's server: the note says what the bundled model is; after generations enough to fill the
    transcript, Ctrl+Enter in the prompt leaves the transcript, its newest text and the prompt in the window."""
    from selenium.webdriver.common.keys import Keys

    for driver in chromium(size=(1280, 900)):
        text_of = open_playground(driver, bundled_server)
        driver.execute_script("localStorage.clear()")
        driver.refresh()
        wait_for(lambda: text_of("model") == "txl-books-byte", what="the model name")
        note = by_id(driver, "model-note")
        assert note.is_displayed() and "demonstration" in note.text and "--model" in note.text
        fill(driver, {"max-tokens": "300", "temperature": "0.8", "seed": "3"})
        for turn in range(4):
            by_id(driver, "prompt").send_keys(f"Chapter {turn + 1}. It was a dark and stormy night", Keys.CONTROL,
                                             Keys.ENTER)  # fmt: skip
            wait_for(
                lambda turn=turn: text_of("session-version") == str(turn + 2), timeout=60, what="the turn"
            )
            layout = driver.execute_script(
                """const t = document.getElementById('transcript'), box = t.getBoundingClientRect();
                const prompt = document.getElementById('prompt').getBoundingClientRect();
                return {top: box.top, bottom: box.bottom, promptBottom: prompt.bottom, height: innerHeight,
                        unseen: t.scrollHeight - t.scrollTop - t.clientHeight, overflows: t.scrollHeight > t.clientHeight};"""
            )
            assert layout["top"] >= 0 and layout["bottom"] <= layout["height"], layout
            assert layout["promptBottom"] <= layout["height"], layout
            assert layout["unseen"] <= 2, layout  # the newest text is in view
        assert layout["overflows"]  # the transcript did fill its box: the check above was not empty
        screenshot(driver, "bundled-model-900px.png")
        assert not severe_errors(driver)
