"""/v1/audio/voices: the uploaded voices a TTS model clones (Qwen3-TTS Base).

    POST   /v1/audio/voices         multipart form: `audio` (the file), `text` (its
                                     transcript), `name`; or JSON {"audio": "<base64>",
                                     "text": ..., "name": ...} -> 201 the voice's record
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

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol_media import VoiceUploadRequest
from omnistage.entrypoints.openai.serving import ERROR_RESPONSES, OpenAIServing, ServingContext
from omnistage.voice_store import MAX_UPLOAD_BYTES


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

    async def upload(self, raw: Request) -> JSONResponse:
        data, text, name = await self._read_upload(raw)
        try:
            record = await asyncio.to_thread(self.store.add, data, text, name)
        except ValueError as e:
            raise OpenAIError.from_value_error(e) from None
        return JSONResponse(_public(record), status_code=HTTPStatus.CREATED)

    async def _read_upload(self, raw: Request) -> tuple[bytes, str | None, str | None]:
        """(audio bytes, transcript, name) of a multipart form or a JSON body."""
        if raw.headers.get("content-type", "").startswith("multipart/form-data"):
            form = await raw.form(max_part_size=MAX_UPLOAD_BYTES + 1)
            audio = form.get("audio")
            if not isinstance(audio, UploadFile):
                raise OpenAIError("audio: a file part named 'audio' is required", param="audio")
            fields = {k: form.get(k) for k in ("text", "name")}
            for key, value in fields.items():
                if value is not None and not isinstance(value, str):
                    raise OpenAIError(f"{key}: expected a text field", param=key)
            return await audio.read(MAX_UPLOAD_BYTES + 1), fields["text"], fields["name"]
        try:
            body = VoiceUploadRequest.model_validate_json(await raw.body())
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(x) for x in first["loc"]) or "body"
            raise OpenAIError(f"{param}: {first['msg']}", param=param) from None
        try:
            return base64.b64decode(body.audio, validate=True), body.text, body.name
        except (binascii.Error, ValueError):
            raise OpenAIError("audio: not base64", param="audio") from None

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
