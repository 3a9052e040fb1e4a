"""/v1/audio/voices: the uploaded voices a TTS model clones (Qwen3-TTS Base).

    POST   /v1/audio/voices         {"audio": "<base64 wav/flac>", "text": "its transcript",
                                     "name": "my voice"} -> 201 the voice's record
    GET    /v1/audio/voices         -> {"object": "list", "data": [records]}
    DELETE /v1/audio/voices/{id}    -> {"id": ..., "object": "voice", "deleted": true}

A record is `{"id": "voice-…", "object": "voice", "name", "text", "seconds",
"created_at"}`; `id` is what `/v1/audio/speech` takes as `voice`. Clips are checked
(`omnistage.voice_store.load_reference_audio`: a decodable audio file, 1-30 s, not
silent, at most 16 MiB) and kept on disk under the cache dir, so they survive a
restart. Served where the pipeline's entry stage is a talker that renders its own
prompt (a TTS model).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import VoiceUploadRequest
from omnistage.entrypoints.openai.serving import ERROR_RESPONSES, OpenAIServing, ServingContext


class VoicesServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return getattr(ctx.client, "voice_store", None) is not None

    @property
    def store(self) -> Any:
        return self.ctx.client.voice_store  # type: ignore[attr-defined]

    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/audio/voices",
            self.upload,
            methods=["POST"],
            status_code=HTTPStatus.CREATED,
            responses=ERROR_RESPONSES,
        )
        router.add_api_route("/v1/audio/voices", self.list, methods=["GET"])
        router.add_api_route(
            "/v1/audio/voices/{voice_id}",
            self.delete,
            methods=["DELETE"],
            responses=ERROR_RESPONSES,
        )

    async def upload(self, body: VoiceUploadRequest) -> JSONResponse:
        try:
            data = base64.b64decode(body.audio, validate=True)
        except (binascii.Error, ValueError):
            raise OpenAIError("audio: not base64", param="audio") from None
        try:
            record = await asyncio.to_thread(self.store.add, data, body.text, body.name)
        except ValueError as e:
            raise OpenAIError.from_value_error(e) from None
        return JSONResponse(_public(record), status_code=HTTPStatus.CREATED)

    async def list(self) -> dict[str, Any]:
        records = await asyncio.to_thread(self.store.list)
        return {"object": "list", "data": [_public(r) for r in records]}

    async def delete(self, voice_id: str) -> dict[str, Any]:
        if not await asyncio.to_thread(self.store.delete, voice_id):
            raise OpenAIError(
                f"voice_id: no uploaded voice {voice_id!r}", HTTPStatus.NOT_FOUND, "voice_id"
            )
        return {"id": voice_id, "object": "voice", "deleted": True}


def _public(record: dict[str, Any]) -> dict[str, Any]:
    shown = {k: v for k, v in record.items() if k not in ("id", "created_ns")}
    return {"id": record["id"], "object": "voice", **shown}
