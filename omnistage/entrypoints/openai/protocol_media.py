"""Request and response shapes of the endpoints of pipelines that draw or speak
(`/v1/images/*`, `/v1/audio/*`), as pydantic models; the rules are `protocol`'s."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from omnistage.entrypoints.openai.protocol import INT64_MAX, DrawFields, Int, RequestModel


class ImageGenerationRequest(DrawFields):
    """POST /v1/images/generations. `num_inference_steps`, `guidance_scale`,
    `negative_prompt` and `seed` are extensions (vLLM-Omni's), read by the draw stage."""

    prompt: str = Field(min_length=1)
    model: str | None = None
    n: Int = Field(default=1, ge=1, le=10)
    response_format: Literal["b64_json", "url"] = "b64_json"
    quality: str | None = None
    style: str | None = None
    user: str | None = None
    seed: Int | None = Field(default=None, ge=0, le=INT64_MAX)
    extra_args: dict[str, Any] | None = None
    """vLLM-Omni's: the model's own per-request options (`model_options.py`)."""


class ImageData(BaseModel):
    b64_json: str
    revised_prompt: str | None = None


class ImageGenerationResponse(BaseModel):
    created: int
    data: list[ImageData]


class VoiceUploadRequest(RequestModel):
    """POST /v1/audio/voices: a reference clip (base64 audio file: wav, flac, ...) and its
    transcript."""

    audio: str = Field(min_length=1)
    text: str | None = None
    name: str | None = None


class SpeechRequest(RequestModel):
    """POST /v1/audio/speech."""

    model: str
    input: str = Field(min_length=1, max_length=4096)
    voice: str | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac"] = "wav"
    speed: float | None = Field(default=None, gt=0, le=4)
    instructions: str | None = Field(default=None, max_length=4096)
    language: str | None = Field(default=None, max_length=64)
    """Extension (TTS models): the language to speak; None: "auto"."""
    stream: bool = False
    stream_format: Literal["audio", "sse"] | None = None
    seed: Int | None = Field(default=None, ge=0, le=INT64_MAX)
    """Extension: seeds every sampling stage (each with its deploy defaults), so a model that
    samples its speech (or starts it from noise) says the same for the same seed."""
