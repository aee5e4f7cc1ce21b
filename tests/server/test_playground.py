"""The playground page at `/`: served without the key, its API calls with it, and in a real headless Chromium
(Debian's `chromium`, driven by Playwright) it streams a reply and shows TTFT, tok/s and the roofline gauge."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from server_harness import start_server

KEY = "sk-playground"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def keyed_server(tiny_model):
    running = start_server(tiny_model, api_key=KEY, max_batch=2)
    assert running.state.status == "ok", running.state.error
    yield running
    running.stop()


def test_page_and_static_files_are_open_and_info_needs_the_key(keyed_server):
    with keyed_server.http() as http:
        page = http.get("/")
        assert page.status_code == 200 and "Solo playground" in page.text
        assert http.get("/static/playground.js").status_code == 200
        assert http.get("/static/playground.css").headers["content-type"].startswith("text/css")
        assert http.get("/static/app.py", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404
        assert http.get("/playground/info").status_code == 401
        info = http.get("/playground/info", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert info["model"] == "tiny" and info["device"] == "cpu" and info["backend"] == "eager"
    assert info["context"] == 256 and info["chat"] is True
    assert info["bandwidth_gbps"] > 0 and info["bytes_per_token"] > 0
    assert info["roofline_tokens_per_s"] == pytest.approx(info["bandwidth_gbps"] * 1e9 / info["bytes_per_token"])


@contextlib.contextmanager
def _browser() -> Iterator[Any]:
    # Debian's headless chromium driven by Playwright, or the test skips saying what is missing.
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with playwright.sync_playwright() as p:
        yield p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])


@pytest.mark.slow
def test_browser_types_a_prompt_and_sees_streamed_text(keyed_server):
    with _browser() as browser:
        try:
            page = browser.new_page()
            page.goto(keyed_server.base_url + "/")
            page.wait_for_selector("text=needs an API key", timeout=30_000)
            page.fill("#api-key", KEY)
            page.dispatch_event("#api-key", "change")
            page.wait_for_function("document.getElementById('model-info').textContent.includes('tiny')",
                                   timeout=30_000)
            assert "cpu" in page.text_content("#model-info")
            _send_greedy(page, "def add(a, b):", max_tokens=24)
            reply = page.text_content(".msg.assistant .text")
            assert reply, "no streamed text"
            assert page.text_content("#ttft").endswith(" ms")
            assert page.text_content("#tps").endswith(" tok/s")
            assert page.text_content("#roofline-pct").endswith("%")
        finally:
            browser.close()



def _send_greedy(page: Any, prompt: str, max_tokens: int) -> None:  # noqa: ANN401
    # Send a greedy turn from the page's form and wait until its reply has finished (its stats shown).
    page.fill("#max_tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    page.wait_for_function("document.getElementById('tokens').textContent !== '–' && "
                           "!document.getElementById('send').disabled", timeout=60_000)


THINKING_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'assistant' %}<|Assistant|>"
                     "{{ m['content'].split('</think>')[-1] }}<|end|>{% else %}<|User|>{{ m['content'] }}{% endif %}"
                     "{% endfor %}{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}")


@pytest.mark.slow
def test_browser_shows_thinking_drops_a_failed_turn_and_says_when_the_server_is_gone(tiny_model):
    # A trial found the page blank while a thinking model thought (it read only `content`), a failed turn left
    # in the transcript but not in the history sent next, and a stopped server shown as connected.
    errors = []
    with _browser() as browser:
        running = start_server(tiny_model, max_batch=2, chat_template=THINKING_TEMPLATE,
                               reasoning_parser="deepseek_r1")
        assert running.state.status == "ok", running.state.error
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.goto(running.base_url + "/")
            page.wait_for_function("document.getElementById('model-info').textContent.includes('tiny')",
                                   timeout=30_000)
            _send_greedy(page, "hello", max_tokens=12)
            assert page.is_visible(".msg.assistant .thinking") and page.text_content(".thinking .thought")
            assert page.text_content("#ttft").endswith(" ms")
            assert page.evaluate("state.messages.length") == 2  # the turn is kept, its reply the content
            page.fill("#max_tokens", "100000")  # refused (400): the turn leaves the transcript and the history
            page.fill("#prompt", "second")
            page.press("#prompt", "Enter")
            page.wait_for_function("document.getElementById('error').textContent !== ''", timeout=30_000)
            assert page.evaluate("state.messages.length") == 2 and page.locator(".msg.user").count() == 1
            assert page.input_value("#prompt") == "second"  # (to send again)
            running.stop()
            page.fill("#max_tokens", "4")
            page.press("#prompt", "Enter")
            page.wait_for_function("document.getElementById('error').textContent.includes('cannot be reached')",
                                   timeout=30_000)
            page.wait_for_function("document.getElementById('model-info').textContent.includes('cannot be "
                                   "reached')", timeout=30_000)
        finally:
            browser.close()
            running.stop()
    assert not [e for e in errors if "Failed to load resource" not in e and "ERR_CONNECTION_REFUSED" not in e], \
        errors
