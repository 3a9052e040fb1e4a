"""The browser playground (`omnistage serve --ui`), driven in headless Chromium with
Playwright against real servers on loopback ports: demo-omni (text chat streamed, chat
with speech, /v1/audio/speech, a server error), demo-image (an image), a tiny text model
behind an API key, and the page's absence without --ui. Each browser test leaves a
screenshot under its `tmp_path` (the path is printed; `pytest -s` shows it).

The browser is Debian's Chromium (`/usr/bin/chromium`, or $OMNISTAGE_CHROMIUM), never
one Playwright downloads; without it or the `playwright` package the browser tests
skip, naming what is missing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile

from omnistage.entrypoints.cli import build_parser
from tests.server.conftest import TINY, LiveServer, PipelineServer

CHROMIUM = os.environ.get("OMNISTAGE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
KEY = "playground-key"
WAIT_MS = 120_000


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the `playwright` Python package (pip install playwright)")
    if shutil.which(CHROMIUM) is None:
        missing.append(f"a Chromium browser at {CHROMIUM} (set $OMNISTAGE_CHROMIUM)")
    return "missing " + " and ".join(missing) if missing else None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1000, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(WAIT_MS)
    yield tab
    shot = tmp_path / f"{request.node.name}.png"
    tab.screenshot(path=str(shot), full_page=True)
    print(f"\nplayground screenshot: {shot}")
    context.close()


@pytest.fixture(scope="module")
def omni_ui() -> Iterator[PipelineServer]:
    with PipelineServer("demo-omni", ui=True) as live:
        yield live


@pytest.fixture(scope="module")
def image_ui() -> Iterator[PipelineServer]:
    with PipelineServer("demo-image", ui=True) as live:
        yield live


def _open(page: Any, url: str) -> None:
    """The playground from `url` (GET / redirects to /ui/), once it has read the model."""
    page.goto(url + "/")
    page.wait_for_selector("body[data-ready=true]", state="attached")
    assert page.url == url + "/ui/"


def _send_chat(page: Any, prompt: str, mode: str = "text", **fields: str) -> Any:
    """Type `prompt`, send it, and wait for the reply (the page marks it done)."""
    page.select_option("#mode", mode)
    for name, value in fields.items():
        page.fill(f"#{name.replace('_', '-')}", value)
    page.fill("#prompt", prompt)
    page.click("#send")
    return page.wait_for_selector(".message.assistant.done", state="attached")


def _error_shown(page: Any) -> str:
    box = page.locator("#error")
    return "" if box.is_hidden() else box.text_content()


# -- what the page learns: /v1/models ----------------------------------------------------------
def test_model_cards_say_what_each_model_makes(omni_ui, image_ui) -> None:
    omni = httpx.get(f"{omni_ui.url}/v1/models").json()["data"][0]
    assert omni["output_modalities"] == ["text", "audio"]
    assert omni["chat_modalities"] == ["text", "audio"]
    assert omni["input_modalities"][0] == "text"
    image = httpx.get(f"{image_ui.url}/v1/models/demo-image").json()
    assert "image" in image["output_modalities"] and "audio" not in image["output_modalities"]


# -- the page in the browser --------------------------------------------------------------------
def test_chat_streams_the_same_text_as_the_api(page, omni_ui) -> None:
    _open(page, omni_ui.url)
    assert page.locator("#mode-label").is_visible()  # demo-omni speaks: the page offers it
    prompt = "Hello there, how are you?"
    reply = _send_chat(page, prompt, temperature="0")
    shown = reply.query_selector(".text").text_content()
    assert _error_shown(page) == ""
    expected = omni_ui.openai().chat.completions.create(
        model="demo-omni", messages=[{"role": "user", "content": prompt}], temperature=0
    )
    assert shown and shown == expected.choices[0].message.content
    timings = page.locator("#timings").text_content()
    assert "time to first token (page)" in timings and "total (page)" in timings
    omni_ui.wait_idle()


AUDIO_FACTS = """async (audio) => {
    const bytes = new Uint8Array(await (await fetch(audio.src)).arrayBuffer());
    const tag = (at) => String.fromCharCode(...bytes.slice(at, at + 4));
    if (audio.readyState < 1) {
        await new Promise((resolve, reject) => {
            audio.addEventListener("loadedmetadata", resolve, { once: true });
            audio.addEventListener("error", () => reject(new Error("not playable")), { once: true });
            audio.load();
        });
    }
    return { riff: tag(0), wave: tag(8), size: bytes.length, duration: audio.duration };
}"""


def _check_wav(audio: Any) -> None:
    facts = audio.evaluate(AUDIO_FACTS)
    assert facts["riff"] == "RIFF" and facts["wave"] == "WAVE", facts
    assert facts["size"] > 44 and facts["duration"] > 0, facts


def test_speech_plays_a_wav(page, omni_ui) -> None:
    _open(page, omni_ui.url)
    reply = _send_chat(page, "Say hello", mode="speak")
    assert _error_shown(page) == ""
    _check_wav(reply.query_selector("audio[controls]"))
    assert reply.query_selector("audio").get_attribute("src").startswith("data:audio/wav;base64,")
    # /v1/audio/speech, from the speech form: a blob URL of the WAV.
    page.fill("#speech-input", "Hello there")
    page.click("#speak")
    _check_wav(page.wait_for_selector("#speech-output audio[controls]"))
    assert page.locator("#voices-section").is_hidden()  # demo-omni takes no uploaded voice
    omni_ui.wait_idle()


def test_image_appears(page, image_ui) -> None:
    _open(page, image_ui.url)
    assert page.locator("#image-section").is_visible()
    page.fill("#image-prompt", "a red fox in the snow")
    page.fill("#image-size", "64x64")
    page.fill("#image-steps", "2")
    page.click("#draw")
    image = page.wait_for_selector("#images img")
    page.wait_for_function("(img) => img.complete && img.naturalWidth > 0", arg=image)
    assert image.evaluate("(img) => img.naturalWidth") == 64
    assert _error_shown(page) == ""
    image_ui.wait_idle()


def test_a_server_error_is_shown(page, omni_ui) -> None:
    _open(page, omni_ui.url)
    _send_chat(page, "Hello", max_tokens="1000000")
    page.wait_for_selector("#error", state="visible")
    assert "400" in _error_shown(page) and "max_tokens" in _error_shown(page)
    omni_ui.wait_idle()


def test_the_page_asks_for_the_api_key(page, tiny_llama) -> None:
    with LiveServer(str(tiny_llama), TINY, api_key=KEY, ui=True, max_model_len=256) as live:
        assert httpx.get(f"{live.url}/ui/app.js").status_code == 200  # the page: no key
        assert httpx.get(f"{live.url}/v1/models").status_code == 401  # the API: the key
        page.goto(live.url + "/ui/")
        page.wait_for_selector("#key-form", state="visible")
        page.wait_for_selector("#error", state="visible")  # shown once the body is read
        assert "401" in _error_shown(page)
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        page.wait_for_selector("body[data-ready=true]", state="attached")
        assert page.locator("#model option").text_content() == TINY
        assert _error_shown(page) == "" and page.locator("#chat-section").is_visible()
        assert page.locator("#mode-label").is_hidden()  # a text model does not speak


@pytest.fixture(scope="module")
def voices_ui(tmp_path_factory) -> Iterator[PipelineServer]:
    """A tiny Qwen3-TTS Base checkpoint: it speaks (no chat) and clones uploaded voices."""
    from omnistage.families.qwen3_tts.tiny import make_tiny_qwen3_tts

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMNISTAGE_CACHE_DIR", str(tmp_path_factory.mktemp("voices-cache")))
        ckpt = make_tiny_qwen3_tts(tmp_path_factory.mktemp("tts-base") / "base", 0, "base")
        with PipelineServer(str(ckpt), ui=True) as live:
            yield live


def test_upload_a_voice_and_speak_with_it(page, voices_ui, tmp_path) -> None:
    clip = tmp_path / "hum.wav"
    t = np.arange(24000 * 2) / 24000
    soundfile.write(clip, 0.3 * np.sin(2 * np.pi * 180 * t), 24000)
    _open(page, voices_ui.url)
    assert page.locator("#chat-section").is_hidden()  # a TTS model answers no chat
    assert page.locator("#voices-section").is_visible()
    page.set_input_files("#voice-file", str(clip))
    page.fill("#voice-text", "A hum.")
    page.fill("#voice-name", "hum")
    page.click("#upload")
    listed = page.wait_for_selector("#voice-list li")
    assert "hum" in listed.text_content() and "2" in listed.text_content()
    page.select_option("#voice", label="hum")
    page.fill("#speech-input", "Hi.")
    page.click("#speak")
    _check_wav(page.wait_for_selector("#speech-output audio[controls]"))
    assert _error_shown(page) == ""
    voices_ui.wait_idle()


# -- without --ui -------------------------------------------------------------------------------
def test_no_page_without_ui(http) -> None:
    for path in ("/", "/ui", "/ui/", "/ui/app.js"):
        assert http.get(path).status_code == 404, path


def test_cli_ui_flag() -> None:
    parser = build_parser(benchmarks=())
    assert parser.parse_args(["serve"]).ui is False
    assert parser.parse_args(["serve", "--ui"]).ui is True
    assert parser.parse_args(["playground", "--model", "demo-omni"]).ui is True
