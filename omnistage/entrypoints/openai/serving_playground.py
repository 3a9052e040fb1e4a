"""The browser playground (`omnistage serve --ui`, or `omnistage playground`).

Owns the static page under `playground/` (index.html, app.js, style.css: plain HTML,
JS and CSS shipped as package data, no build step, nothing fetched from elsewhere) and
where it is served: `/ui/` (the page and its files) and `GET /`, a redirect there.
Without `--ui` none of these routes exist.

The page talks only to this server's own OpenAI endpoints: it reads what the model can
do from `GET /v1/models` (`output_modalities`, `chat_modalities`) and whether
`GET /v1/audio/voices` answers, streams chat from `/v1/chat/completions`, and draws
and speaks through `/v1/images/generations` and `/v1/audio/speech`. The page holds no
secret, so with an API key its files are served without one (`OPEN_PATHS`); every
endpoint it calls still wants the key, which it asks for when it gets a 401.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

PLAYGROUND_DIR = Path(__file__).with_name("playground")
"""The page's files (package data)."""
UI_PATH = "/ui"
OPEN_PATHS = frozenset({"", UI_PATH})
"""Paths (without their trailing slash) answered without the API key: `/` and `/ui`."""
OPEN_PREFIXES = (UI_PATH + "/",)
"""Path prefixes answered without the API key: the page's files."""


def mount_playground(app: FastAPI) -> None:
    """Serve the page at `/ui/` on `app`, and redirect `GET /` there."""
    files = StaticFiles(directory=PLAYGROUND_DIR, html=True)
    app.mount(UI_PATH, files, name="playground")

    async def root() -> RedirectResponse:
        return RedirectResponse(UI_PATH + "/")

    app.add_api_route("/", root, methods=["GET"], include_in_schema=False)
