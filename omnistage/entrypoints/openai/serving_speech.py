"""POST /v1/audio/speech, for pipelines that speak (a final stage whose
`final_output_type` is audio: Qwen3-TTS, `demo-qwen3-tts`, Qwen3-Omni, `demo-omni`,
Qwen2.5-Omni).

    {"model": "demo-omni", "input": "Hello there", "voice": "ethan", "response_format": "wav"}
    -> the audio file (16-bit mono at the model's rate: 24 kHz for Qwen3-Omni)

A TTS model (its entry stage renders its own prompt: Qwen3-TTS) gets the text as it
is, with `instructions` (how to speak; a VoiceDesign checkpoint's voice in words) and
`language` (an extension; left out: "auto"). An omni model is asked to read the
text: its entry stage gets the chat message "Read the following text aloud, word for
word, and say nothing else:\\n<input>" through its chat template, and the audio of the
reply is the answer (a model that paraphrases reads it less faithfully than a TTS
would); `instructions` and `language` are a 400 there.

`voice`: one of the model's speakers (its talker checkpoint's, any case: Qwen3-Omni
"ethan" (default), "chelsie", "aiden"; Qwen2.5-Omni "Chelsie" (default), "Ethan";
Qwen3-TTS CustomVoice its `spk_id` names, the first the default), or left out for the
default; any other is a 400 naming `voice` with the choices. `response_format`: wav,
pcm (raw 16-bit little-endian mono samples at the model's rate), flac, mp3 or opus;
aac is a 400. `speed` (0.25-4) changes the tempo, not the pitch
(`multimodal.time_stretch`, WSOLA); streamed audio is served at speed 1 only.
`stream: true` (wav or pcm) sends the audio as the pipeline produces it: pcm chunks as
they arrive, for wav first a WAV header whose lengths say "unknown" (0xFFFFFFFF, as
streaming TTS servers send). A client that disconnects aborts the request in every
stage.
"""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import time
import uuid
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.pipeline_deploy import seeded_params
from omnistage.entrypoints.openai.protocol_media import SpeechRequest
from omnistage.entrypoints.openai.serving import ERROR_RESPONSES, OpenAIServing, ServingContext
from omnistage.entrypoints.openai.sse import EventStream, until_disconnect
from omnistage.pipeline.outputs import OmniRequestOutput

READ_ALOUD = "Read the following text aloud, word for word, and say nothing else:\n"
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
}
_CONTAINERS = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS")}
"""soundfile's (format, subtype) per response format; the others are 16-bit PCM."""
UNKNOWN_LENGTH = 0xFFFFFFFF


class AudioStream(EventStream):
    """Audio bytes as they come, cancelled (the request aborted) when the client leaves."""

    def __init__(self, chunks: AsyncIterator[bytes], media_type: str) -> None:
        self.media_type = media_type
        super().__init__(chunks)  # type: ignore[arg-type]


class SpeechServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return ctx.client.speaks

    @property
    def client(self) -> PipelineClient:
        return self.ctx.client  # type: ignore[return-value]

    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/audio/speech",
            self.create,
            methods=["POST"],
            response_class=Response,
            responses={200: {"content": {t: {} for t in MEDIA_TYPES.values()}}, **ERROR_RESPONSES},
        )

    def check_supported(self, body: SpeechRequest) -> str | None:
        """The request's voice as the checkpoint spells it; OpenAIError for what cannot be
        served."""
        self.check_model(body.model)
        if not body.input.strip():  # an omni model would be asked to read nothing
            raise OpenAIError("input: is blank; give the text to speak", param="input")
        voice = self.client.check_voice(body.voice, "voice")
        if body.response_format not in MEDIA_TYPES:
            raise OpenAIError(
                f"response_format: {body.response_format!r} is not served; use "
                f"{', '.join(MEDIA_TYPES)}",
                param="response_format",
            )
        if body.speed is not None and not 0.25 <= body.speed <= 4.0:
            raise OpenAIError("speed: must be between 0.25 and 4", param="speed")
        if body.stream and body.speed not in (None, 1.0):
            raise OpenAIError("speed: streamed audio is served at speed 1 only", param="speed")
        if not self.client.entry_builds_its_prompt:
            for field in ("instructions", "language"):
                if getattr(body, field) is not None:
                    raise OpenAIError(f"{field}: not supported by this model", param=field)
        if body.stream_format == "sse":
            raise OpenAIError("stream_format: only 'audio' is served", param="stream_format")
        if body.stream and body.response_format not in ("wav", "pcm"):
            raise OpenAIError(
                f"response_format: streaming serves wav or pcm, not {body.response_format}",
                param="response_format",
            )
        return voice

    async def create(self, body: SpeechRequest, raw: Request) -> Response:
        voice = self.check_supported(body)
        stage = self.client.final_stage("audio")
        assert stage is not None
        speech: dict[str, str | None] = {}
        if self.client.entry_builds_its_prompt:  # a TTS model: the text as it is
            prompt: Any = body.input
            speech = {"instructions": body.instructions, "language": body.language}
        else:
            prompt = {"messages": [{"role": "user", "content": READ_ALOUD + body.input}]}
        request_id = f"speech-{uuid.uuid4().hex}"
        arrival = time.monotonic()
        params = None if body.seed is None else seeded_params(self.client.deploy, body.seed)
        updates = self.client.generate(
            prompt, params, ["audio"], request_id, {"prompt": "input"}, voice=voice, **speech
        )
        first = await anext(updates)  # 400s are raised here, before the response starts
        if body.stream:
            media = MEDIA_TYPES[body.response_format]
            return AudioStream(self.stream(body, stage.name, first, updates, arrival), media)
        audio = await until_disconnect(raw, self.collect(stage.name, first, updates, arrival))
        samples, rate = audio
        if body.speed not in (None, 1.0):
            from omnistage.multimodal.time_stretch import time_stretch

            samples = await asyncio.to_thread(time_stretch, samples, rate, body.speed)
        data = await asyncio.to_thread(encode, samples, rate, body.response_format)
        return Response(data, media_type=MEDIA_TYPES[body.response_format])

    def _observe_first(self, stage: str, arrival: float) -> None:
        self.ctx.metrics.on_first_audio(stage, time.monotonic() - arrival)

    async def collect(
        self,
        stage: str,
        first: OmniRequestOutput,
        updates: AsyncIterator[OmniRequestOutput],
        arrival: float,
    ) -> tuple[np.ndarray, int]:
        output, seen_audio = first, False
        try:
            while True:
                if not seen_audio and output.stage == stage and output.new_data is not None:
                    seen_audio = True
                    self._observe_first(stage, arrival)
                if output.finished:
                    break
                output = await anext(updates)
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
        if output.audio is None or output.sample_rate is None:
            raise OpenAIError("the pipeline produced no audio", HTTPStatus.INTERNAL_SERVER_ERROR)
        if not seen_audio:
            self._observe_first(stage, arrival)
        return output.audio, output.sample_rate

    async def stream(
        self,
        body: SpeechRequest,
        stage: str,
        first: OmniRequestOutput,
        updates: AsyncIterator[OmniRequestOutput],
        arrival: float,
    ) -> AsyncIterator[bytes]:
        output, header_sent = first, body.response_format != "wav"
        try:
            while True:
                if output.stage == stage and output.new_data is not None:
                    rate = output.sample_rate or 24000
                    if not header_sent:
                        self._observe_first(stage, arrival)
                        yield wav_header(rate, UNKNOWN_LENGTH)
                        header_sent = True
                    yield to_pcm16(output.new_data.to(dtype=_float32()).numpy())
                if output.finished:
                    break
                try:
                    output = await anext(updates)
                except OpenAIError:  # ended by a shutdown or a failed stage: end the audio
                    break
        finally:
            await updates.aclose()  # type: ignore[attr-defined]
        if not header_sent:  # no audio at all: still a valid (empty) WAV
            yield wav_header(output.sample_rate or 24000, 0)


def _float32() -> Any:
    import torch

    return torch.float32


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as 16-bit little-endian PCM, converted as libsndfile
    converts them when it writes a whole WAV file (to 32-bit by truncation, then the top
    16 bits: rounding towards minus infinity), so streamed samples equal the file's."""
    wide = np.trunc(samples.reshape(-1).astype(np.float64) * 2.0**31)
    return (np.clip(wide, -(2.0**31), 2.0**31 - 1).astype(np.int64) >> 16).astype("<i2").tobytes()


def pcm16_base64(samples: Any) -> str:
    """A chunk of float samples (a tensor) as base64 16-bit PCM (a streamed audio delta)."""
    pcm = to_pcm16(samples.to(dtype=_float32()).numpy())
    return base64.b64encode(pcm).decode("ascii")


def wav_header(sample_rate: int, data_bytes: int) -> bytes:
    """A 44-byte PCM WAV header (16-bit mono); `data_bytes` 0xFFFFFFFF: length unknown."""
    riff = UNKNOWN_LENGTH if data_bytes == UNKNOWN_LENGTH else 36 + data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        1,  # mono
        sample_rate,
        sample_rate * 2,
        2,
        16,
        b"data",
        data_bytes,
    )


def encode(samples: np.ndarray, sample_rate: int, response_format: str) -> bytes:
    if response_format == "pcm":
        return to_pcm16(samples)
    import soundfile

    buffer = io.BytesIO()
    data = np.clip(samples.reshape(-1), -1.0, 1.0)
    container, subtype = _CONTAINERS.get(response_format, (response_format.upper(), "PCM_16"))
    soundfile.write(buffer, data, sample_rate, format=container, subtype=subtype)
    return buffer.getvalue()
