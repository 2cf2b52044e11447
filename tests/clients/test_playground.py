"""The browser playground: served files, and a real headless Chromium that generates, forks, deletes and scores."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from txl_client import Client, NotFound
from txl_server.api.app import STATIC_DIR

from tests.helpers import browser as browser_helpers
from tests.helpers.browser import chromium, open_playground, screenshot, wait_for

from .conftest import API_KEY

DOCUMENT = "Call me Ishmael. Some years ago — never mind how long — I went to sea, café au lait.\n" * 3


def test_playground_files_are_served_and_self_contained(server):
    with httpx.Client(base_url=server.url) as http:
        page = http.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assets = sorted(p.name for p in STATIC_DIR.iterdir() if p.suffix in (".js", ".css"))
        assert "app.js" in assets and "style.css" in assets
        for asset in assets:  # every script and style the page loads, and nothing it does not
            assert http.get(f"/{asset}").status_code == 200
            assert f'"{asset}"' in page.text
    for path in STATIC_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        # No CDN, no external fonts: nothing but the server itself is contacted.
        assert not re.search(r"(src|href)=\"(https?:)?//", text), path.name
        assert "@import" not in text and "url(http" not in text, path.name
    for path in STATIC_DIR.glob("*.js"):  # user and model text only ever written with textContent
        script = path.read_text(encoding="utf-8")
        assert "innerHTML" not in script and "insertAdjacentHTML" not in script, path.name
        assert "document.write" not in script, path.name


@pytest.fixture
def sdk(server):
    with Client(server.url, API_KEY) as client:
        yield client


@pytest.fixture
def browser():
    yield from chromium()


@pytest.fixture
def offline_browser():
    """A browser that can reach the test server and nothing else: every other host name fails to resolve."""
    yield from chromium("--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1")


def enter_key(driver) -> None:
    browser_helpers.enter_key(driver, API_KEY)


@pytest.mark.browser
def test_playground_generates_forks_deletes_and_scores(server, browser, sdk):
    from selenium.webdriver.common.by import By

    driver = browser
    text_of = open_playground(driver, server)
    wait_for(lambda: text_of("model") == "API key needed", what="the page to ask for a key")

    enter_key(driver)
    wait_for(lambda: text_of("model") == "tiny-byte", what="the model name")
    assert driver.execute_script("return localStorage.getItem('txl.apiKey')") == API_KEY

    # ---- a generation streams in, token by token
    for element_id, value in (("max-tokens", "40"), ("temperature", "0")):
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)
    driver.find_element(By.ID, "prompt").send_keys("The whale")
    driver.execute_script(
        """window.__lengths = [];
        new MutationObserver(() => {
          const out = document.querySelector('#transcript .generated');
          if (out) window.__lengths.push(out.textContent.length);
        }).observe(document.getElementById('transcript'), {childList: true, subtree: true, characterData: true});"""
    )
    driver.find_element(By.ID, "generate").click()
    wait_for(lambda: text_of("session-version") == "2", what="the generation to finish")
    generated = driver.find_element(By.CSS_SELECTOR, "#transcript .generated").get_attribute("textContent")
    lengths = driver.execute_script("return window.__lengths")
    assert len(set(lengths)) >= 3, lengths  # the text grew in steps as tokens arrived, not all at once
    assert driver.find_element(By.CSS_SELECTOR, "#transcript .prompt").text == "The whale"
    assert driver.find_element(By.ID, "prompt").get_attribute("value") == ""
    expected = sdk.generate(sdk.create_session().id, "The whale", max_tokens=40, temperature=0)
    assert generated == expected.text
    session_id = text_of("session-id")
    assert (
        text_of("session-tokens") == str(expected.session.tokens) == str(sdk.get_session(session_id).tokens)
    )
    assert re.fullmatch(r"\d+ / 32", text_of("session-mem"))
    # The last line keeps the rate (docs/clients.md, the playground) beside why it finished.
    assert re.fullmatch(r"40 tokens · \d+\.\d tokens/s · finished: max tokens", text_of("gen-status"))
    screenshot(driver, "playground-generate.png")

    # ---- the transcript is a conversation: a later visit shows it again, from the conversation's items
    conversation = driver.execute_script("return localStorage.getItem('txl.conversationId')")
    assert conversation == f"conv_{session_id}"
    items = sdk.conversations.items(conversation)
    assert [(i.role, i.text) for i in items] == [("user", "The whale"), ("assistant", generated)]
    driver.refresh()
    wait_for(lambda: text_of("session-id") == session_id, what="the session again")
    wait_for(
        lambda: len(driver.find_elements(By.CSS_SELECTOR, "#transcript .generated")) == 1, what="the text"
    )
    assert driver.find_element(By.CSS_SELECTOR, "#transcript .prompt").text == "The whale"
    assert (
        driver.find_element(By.CSS_SELECTOR, "#transcript .generated").get_attribute("textContent")
        == generated
    )

    # ---- fork, keep extending the fork, delete it
    driver.find_element(By.ID, "fork").click()
    wait_for(lambda: text_of("session-id") not in (session_id, ""), what="the fork")
    fork_id = text_of("session-id")
    assert sdk.get_session(fork_id).tokens == sdk.get_session(session_id).tokens
    driver.find_element(By.ID, "prompt").send_keys(" And then")
    driver.find_element(By.ID, "generate").click()
    fork_version = sdk.get_session(fork_id).version
    wait_for(lambda: text_of("session-version") == str(fork_version + 1), what="the second generation")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#transcript .generated")) == 2
    assert sdk.get_session(session_id).version == 2  # the parent did not move
    driver.find_element(By.ID, "delete").click()
    wait_for(lambda: text_of("session-id") == "none yet", what="the deletion")
    with pytest.raises(NotFound):
        sdk.get_session(fork_id)

    # ---- a refused value (Ctrl+Enter skips the form's own checks): one sentence, naming the field once
    from selenium.webdriver.common.keys import Keys

    temperature = driver.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("-1")
    driver.find_element(By.ID, "prompt").send_keys("x", Keys.CONTROL, Keys.ENTER)
    wait_for(lambda: driver.find_element(By.ID, "error").is_displayed(), what="the error")
    # A new session is a conversation's: the Responses API refuses the value, in OpenAI's words.
    assert text_of("error") == "invalid_request_error: temperature should be greater than or equal to 0"
    temperature.clear()
    temperature.send_keys("0")

    # ---- a dropped document is scored and drawn as a heatmap
    driver.find_element(By.ID, "tab-score").click()
    driver.execute_script(
        """const data = new DataTransfer();
        data.items.add(new File([arguments[0]], 'moby.txt', {type: 'text/plain'}));
        document.getElementById('drop-zone').dispatchEvent(
          new DragEvent('drop', {dataTransfer: data, bubbles: true, cancelable: true}));""",
        DOCUMENT,
    )
    wait_for(lambda: driver.find_element(By.ID, "doc").get_attribute("value") == DOCUMENT, what="the drop")
    driver.find_element(By.ID, "score").click()
    wait_for(lambda: driver.find_element(By.ID, "score-results").is_displayed(), what="the score")
    expected_score = sdk.score(DOCUMENT)
    assert text_of("stat-tokens") == f"{expected_score.tokens:,}"
    assert float(text_of("stat-perplexity").replace(",", "")) == pytest.approx(
        expected_score.perplexity, rel=1e-3
    )
    assert float(text_of("stat-bpb")) == pytest.approx(expected_score.bits_per_byte, abs=1e-4)
    spans = driver.find_elements(By.CSS_SELECTOR, "#heatmap span.tok")
    assert len(spans) == len(DOCUMENT)  # one per character: the bytes of "—" and "é" are drawn together
    heatmap_text = driver.find_element(By.ID, "heatmap").get_attribute("textContent")
    assert heatmap_text.replace("↵", "") == DOCUMENT
    titles = [s.get_attribute("title") for s in spans[:40]]
    assert all(re.search(r"\d+\.\d\d bits", t) and "p = " in t for t in titles), titles[:3]
    colours = {s.value_of_css_property("background-color") for s in spans}
    assert len(colours) > 5  # coloured by surprisal, not one flat colour
    dash = next(s for s in spans if s.get_attribute("textContent") == "—")
    assert "3 bytes" in dash.get_attribute("title")
    assert text_of("legend-max").isdigit()
    shot = screenshot(driver, "playground-score.png")
    assert shot.stat().st_size > 10_000

    # ---- readable at a phone's width: nothing wider than the screen
    driver.set_window_size(400, 850)
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(driver, "playground-narrow.png")
    errors = [
        e
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "401" not in e["message"] and "400" not in e["message"]
    ]  # the key prompt's 401 and the refused temperature's 400 were expected
    assert not errors, errors


@pytest.mark.browser
def test_api_docs_render_with_the_network_closed(server, offline_browser):
    """/docs (Swagger UI) and /redoc load their scripts and styles from the server itself, not a CDN."""
    from selenium.webdriver.common.by import By

    driver = offline_browser
    driver.get(server.url + "/docs")
    operations = wait_for(
        lambda: driver.find_elements(By.CSS_SELECTOR, ".swagger-ui .opblock-summary-path"), what="Swagger UI"
    )
    assert driver.find_element(By.CSS_SELECTOR, ".swagger-ui .info .title").text.startswith("TXL Serve")
    paths = {o.get_attribute("data-path") or o.text.replace("\u200b", "") for o in operations}
    assert {"/v1/sessions", "/v1/sessions/{session_id}/generate", "/v1/completions"} <= paths, paths
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map((e) => e.name)")
    assert loaded and all(url.startswith(server.url + "/") for url in loaded), loaded
    screenshot(driver, "api-docs-offline.png")

    driver.get(server.url + "/redoc")
    wait_for(lambda: "/v1/sessions/{session_id}/generate" in driver.find_element(By.TAG_NAME, "body").text,
             what="ReDoc")  # fmt: skip
    # ReDoc's own footer logo is an image from its CDN (it fails here, harmlessly); its code is local.
    code = driver.execute_script(
        "return performance.getEntriesByType('resource').filter((e) => e.initiatorType !== 'img').map((e) => e.name)"
    )
    assert code and all(url.startswith(server.url + "/") for url in code), code


@pytest.mark.browser
def test_playground_starts_a_session_from_a_memory_and_saves_a_document_as_one(server, browser, sdk):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    memory = sdk.memories.create(DOCUMENT, name="moby")
    driver = browser
    text_of = open_playground(driver, server)
    enter_key(driver)
    tokens = len(DOCUMENT.encode())  # a byte-level model
    wait_for(
        lambda: (
            f"moby ({tokens} tokens)"
            in [o.text for o in Select(driver.find_element(By.ID, "memory-select")).options]
        ),
        what="the memories to be listed",
    )

    # ---- pick it: the next generation starts a session from it, exactly as the SDK's
    Select(driver.find_element(By.ID, "memory-select")).select_by_value(memory.id)
    assert "New session from the memory moby" in text_of("transcript")
    for element_id, value in (("max-tokens", "20"), ("temperature", "0")):
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)
    driver.find_element(By.ID, "prompt").send_keys(" Call me")
    driver.find_element(By.ID, "generate").click()
    wait_for(lambda: text_of("session-version") == "2", what="the generation to finish")
    generated = driver.find_element(By.CSS_SELECTOR, "#transcript .generated").get_attribute("textContent")
    expected = sdk.generate(sdk.create_session(memory=memory.id).id, " Call me", max_tokens=20, temperature=0)
    assert generated == expected.text
    assert text_of("session-tokens") == str(tokens + len(" Call me") + 20)

    # ---- a dropped document saved as a memory becomes the pick for new sessions
    driver.find_element(By.ID, "tab-score").click()
    driver.execute_script(
        """const data = new DataTransfer();
        data.items.add(new File([arguments[0]], 'log.txt', {type: 'text/plain'}));
        document.getElementById('drop-zone').dispatchEvent(
          new DragEvent('drop', {dataTransfer: data, bubbles: true, cancelable: true}));""",
        "The keeper's log, night after night. " * 8,
    )
    wait_for(lambda: driver.find_element(By.ID, "doc").get_attribute("value"), what="the drop")
    driver.find_element(By.ID, "save-memory").click()
    wait_for(lambda: "saved as memory" in text_of("score-status"), what="the memory to be saved")
    saved = next(m for m in sdk.memories.list() if m.name == "log.txt")
    assert saved.tokens == len("The keeper's log, night after night. " * 8)
    assert (
        Select(driver.find_element(By.ID, "memory-select")).first_selected_option.get_attribute("value")
        == saved.id
    )
    driver.find_element(By.ID, "tab-generate").click()
    assert "New session from the memory log.txt" in text_of("transcript")
    screenshot(driver, "playground-memory.png")
    for made in (memory.id, saved.id):
        sdk.memories.delete(made)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "401" not in e["message"]]
    assert not errors, errors


@pytest.mark.browser
def test_a_late_answer_to_an_earlier_memories_load_does_not_empty_the_picker(server, browser, sdk):
    """The page loads its memories when it opens (before a key is entered: a 401) and again when a key is
    entered; if the first answer comes last, it must not replace the second's list."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    memory = sdk.memories.create(DOCUMENT, name="late")
    driver = browser
    open_playground(driver, server)
    enter_key(driver)

    def listed() -> list[str]:
        return [o.get_attribute("value") for o in Select(driver.find_element(By.ID, "memory-select")).options]

    wait_for(lambda: memory.id in listed(), what="the memory to be listed")
    # The next memories request is answered 401, after a second: as the page's first load, without a key, can be.
    driver.execute_script(
        """const real = window.fetch;
        let delayed = false;
        window.fetch = (url, init) => {
          if (!delayed && String(url).includes("v1/memories")) {
            delayed = true;
            return new Promise((done) => setTimeout(done, 1000)).then(
              () => new Response('{"error": {"type": "unauthorized"}}', {status: 401}));
          }
          return real(url, init);
        };
        loadMemories();
        loadMemories();"""
    )
    time.sleep(1.5)
    assert memory.id in listed()
    sdk.memories.delete(memory.id)


@pytest.mark.browser
def test_playground_history_goes_back_and_forth_and_regenerates(server, browser, sdk):
    from selenium.webdriver.common.by import By

    driver = browser
    text_of = open_playground(driver, server)
    driver.execute_script("localStorage.removeItem('txl.sessionId')")
    enter_key(driver)
    wait_for(lambda: text_of("model") == "tiny-byte", what="the model name")
    driver.find_element(By.ID, "new-session").click()
    for element_id, value in (("max-tokens", "12"), ("temperature", "0.9"), ("seed", "7")):
        field = driver.find_element(By.ID, element_id)
        field.clear()
        field.send_keys(value)

    def generate(prompt: str, version: int) -> None:
        driver.find_element(By.ID, "prompt").send_keys(prompt)
        driver.find_element(By.ID, "generate").click()
        wait_for(lambda: text_of("session-version") == str(version), what=f"version {version}")

    def history() -> list[str]:
        return [b.text.split("\n")[0] for b in driver.find_elements(By.CSS_SELECTOR, "#history button")]

    def transcript() -> list[str]:
        pieces = driver.find_elements(By.CSS_SELECTOR, "#transcript .prompt, #transcript .generated")
        return [p.get_attribute("textContent") for p in pieces]

    generate("The sea", 2)  # the session is created (version 1), then generated on
    first = transcript()
    session_id = text_of("session-id")
    at_first = sdk.get_session(session_id)
    generate(" Then", 3)
    both = transcript()
    assert len(both) == 4
    wait_for(lambda: len(history()) == 3, what="three versions listed")
    assert history()[0].startswith("v3 · generate") and "(current)" in history()[0]
    assert history()[2].startswith("v1 · create")

    # ---- back to version 2: the session holds its tokens again, and the page shows its text
    driver.find_element(By.CSS_SELECTOR, "#history button[data-version='2']").click()
    wait_for(lambda: text_of("session-version") == "4", what="the rewind")
    assert transcript() == first
    assert sdk.get_session(session_id).tokens == at_first.tokens
    wait_for(lambda: history()[0].startswith("v4 · rewind"), what="the rewind listed")

    # ---- forward again to version 3 (kept): both generations are back
    driver.find_element(By.CSS_SELECTOR, "#history button[data-version='3']").click()
    wait_for(lambda: text_of("session-version") == "5", what="the second rewind")
    assert transcript() == both

    # ---- Regenerate: back to where the last generation started, sampled again (same seed: the same text)
    generate(" Later", 6)
    last = transcript()
    driver.find_element(By.ID, "regenerate").click()
    wait_for(lambda: text_of("session-version") == "8", what="the regeneration (a rewind, then a generation)")
    assert transcript() == last  # the same seed from the same state: exactly the same continuation
    kinds = [line.split(" · ")[1] for line in history()[:3]]
    assert kinds == ["generate", "rewind", "generate"]
    assert driver.find_element(By.ID, "prompt").get_attribute("value") == ""
    screenshot(driver, "playground-history.png")
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE" and "401" not in e["message"]]
    assert not errors, errors
