"""POST /v1/images/generations, for pipelines that draw (a final stage whose
`final_output_type` is image, e.g. `demo-image`, GLM-Image).

    {"model": "demo-image", "prompt": "a red fox", "n": 2, "size": "64x64",
     "response_format": "b64_json", "seed": 7, "num_inference_steps": 4}
    -> {"created": ..., "data": [{"b64_json": "<PNG>", "revised_prompt": "<caption>"}, ...]}

Each of the `n` images is its own pipeline request, run concurrently; with a `seed`
image i is drawn with seed `seed + i` (reproducible), without one with random seeds
(n > 1) or the stage's default (n = 1). `size` is "WxH" and must be a size the draw
stage's model can draw (400 naming `size` otherwise); None draws its default size.
Only `response_format: b64_json` (PNG) is served; `url` is a 400 (the server keeps no
files). `revised_prompt` is the caption the draw stage drew (a think -> recaption
pipeline's caption; the prompt itself where no stage rewrites it). The prompt reaches
the entry stage through its chat template (as `omnistage generate` does), unless the
entry stage renders its prompt itself (GLM-Image's prior). Extensions read by the draw
stage: `num_inference_steps`, `guidance_scale`, `negative_prompt`, `seed`; and the
model's own options, `extra_args` (vLLM-Omni's: Bagel's `{"think": true, "cfg_img_scale":
1.5}`; `model_options.py`): the entry stage's go to it over its deploy defaults (Bagel's
thinking is as long as the understanding stage's default `max_tokens`), the draw stage's
with the image's fields.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import secrets
import time
import uuid
from http import HTTPStatus
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.model_options import read_extra_args
from omnistage.entrypoints.openai.pipeline_client import PipelineClient
from omnistage.entrypoints.openai.protocol_media import (
    ImageData,
    ImageGenerationRequest,
    ImageGenerationResponse,
)
from omnistage.entrypoints.openai.serving import ERROR_RESPONSES, OpenAIServing, ServingContext
from omnistage.entrypoints.openai.sse import until_disconnect

_SIZE = re.compile(r"^([1-9][0-9]{0,5})x([1-9][0-9]{0,5})$")


class ImagesServing(OpenAIServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return ctx.client.draws

    @property
    def client(self) -> PipelineClient:
        return self.ctx.client  # type: ignore[return-value]

    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/images/generations",
            self.create,
            methods=["POST"],
            response_model=ImageGenerationResponse,
            responses=ERROR_RESPONSES,
        )

    async def create(self, body: ImageGenerationRequest, raw: Request) -> JSONResponse:
        if body.model is not None:
            self.check_model(body.model)
        if body.response_format != "b64_json":
            raise OpenAIError(
                "response_format: only b64_json is served (this server keeps no image files)",
                param="response_format",
            )
        self.check_fixed_drawing(body)
        height, width = self.parse_size(body.size)
        if body.seed is not None:
            seeds: list[int | None] = [body.seed + i for i in range(body.n)]
        elif body.n > 1:
            seeds = [secrets.randbelow(2**62) for _ in range(body.n)]
        else:
            seeds = [None]
        options = read_extra_args(body.extra_args, self.client)
        fields: dict[str, Any] = {
            "height": height,
            "width": width,
            "num_inference_steps": body.num_inference_steps,
            "guidance_scale": body.guidance_scale,
            "negative_prompt": body.negative_prompt or None,
            "model_options": options.draw or None,
        }
        prompt = self.prompt(body.prompt)
        return await self.draw_all(raw, prompt, body.prompt, fields, seeds, options.entry)

    async def draw_all(
        self,
        raw: Request,
        prompt: Any,
        caption: str,
        fields: dict[str, Any],
        seeds: list,
        entry_options: dict[str, Any] | None = None,
    ) -> JSONResponse:
        """One pipeline request per seed, run concurrently; the response of all images.
        `entry_options`: the entry stage's `model_options` (`extra_args` it reads)."""
        base_id = f"img-{uuid.uuid4().hex}"
        draws = [
            asyncio.ensure_future(
                self.draw(prompt, caption, fields | {"seed": seed}, f"{base_id}-{i}", entry_options)
            )
            for i, seed in enumerate(seeds)
        ]

        async def all_images() -> list[ImageData]:
            try:
                return await asyncio.gather(*draws)
            finally:  # one failed (or the client left): stop the others
                for task in draws:
                    task.cancel()

        images = await until_disconnect(raw, all_images())
        response = ImageGenerationResponse(created=int(time.time()), data=images)
        return JSONResponse(response.model_dump())

    def check_fixed_drawing(self, body: ImageGenerationRequest) -> None:
        """An image stage that is no diffusion stage (Dynin-Omni's token2image decodes the
        codes its producer wrote) draws its one size with no settings: asking for a size,
        steps, guidance or a negative prompt is a 400 naming the field (a seed goes to the
        entry stage, which writes the codes)."""
        stage = self.client.final_stage("image")
        if stage is None or stage.kind == "diffusion":
            return
        for name in ("size", "num_inference_steps", "guidance_scale", "negative_prompt"):
            value = getattr(body, name)
            if value is not None and value not in ("auto", ""):
                raise OpenAIError(
                    f"{name}: stage {stage.name!r} decodes its producer's image codes at one "
                    "fixed size, with no diffusion settings",
                    param=name,
                )

    def parse_size(self, size: str | None) -> tuple[int | None, int | None]:
        return parse_size(size, self.client.diffusion_limits)

    async def draw(
        self,
        prompt: Any,
        caption: str,
        fields: dict[str, Any],
        request_id: str,
        entry_options: dict[str, Any] | None = None,
    ) -> ImageData:
        """One image of `prompt` (the entry stage's prompt) with the draw stage's `fields`
        (None: the stage's default); `caption`: the revised prompt where no stage writes one."""

        stage = self.client.final_stage("image")
        assert stage is not None
        sampling = self.draw_settings(stage, fields, entry_options)
        renames = {"height": "size", "width": "size"}
        image = revised = None
        async for output in self.client.generate(prompt, sampling, ["image"], request_id, renames):
            if output.finished:
                image = output.image
                result = output.outputs.get(stage.name)
                revised = result.text if result is not None and result.text else caption
        if image is None:
            raise OpenAIError("the pipeline drew no image", HTTPStatus.INTERNAL_SERVER_ERROR)
        png = await asyncio.to_thread(_png, image)
        return ImageData(b64_json=base64.b64encode(png).decode(), revised_prompt=revised)

    def draw_settings(
        self, stage: Any, fields: dict[str, Any], entry_options: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The per-stage settings of one draw: a diffusion stage's `DiffusionParams`, or,
        where the image stage decodes codes, the seed for the entry stage that samples them;
        with `entry_options`, the entry stage's deploy defaults with those `model_options`."""
        from omnistage.diffusion.params import DiffusionParams
        from omnistage.sampling_params import SamplingParams

        (entry,) = self.client.deploy.entry_stages
        settings: dict[str, Any] = {}
        if entry_options:
            entry_fields = {**entry.default_sampling, "model_options": entry_options}
            settings[entry.name] = SamplingParams(**entry_fields)
        if stage.kind == "diffusion":
            try:
                params = DiffusionParams(**{k: v for k, v in fields.items() if v is not None})
            except ValueError as exc:
                raise OpenAIError.from_value_error(exc) from None
            return settings | {stage.name: params}
        if fields.get("seed") is not None:  # the codes' sampler
            seeded = settings[entry.name].clone(seed=fields["seed"]) if settings else None
            settings[entry.name] = seeded or SamplingParams(seed=fields["seed"])
        return settings

    def prompt(self, text: str) -> Any:
        if self.client.entry_builds_its_prompt:
            return text
        return {"messages": [{"role": "user", "content": text}]}


def parse_size(size: str | None, limits: Any) -> tuple[int | None, int | None]:
    """(height, width) of a "WxH" `size` the draw stage's `limits` allow (None: any);
    (None, None) for None or "auto"; a 400 naming `size` otherwise."""
    if size is None or size == "auto":
        return None, None
    match = _SIZE.match(size)
    if match is None:
        raise OpenAIError(
            f"size: expected 'WIDTHxHEIGHT' (e.g. '512x512'), got {size!r}", param="size"
        )
    width, height = int(match.group(1)), int(match.group(2))
    if limits is not None:
        try:
            limits.check_size(height, width)
        except ValueError as exc:
            raise OpenAIError(f"size: {size} is not supported: {exc}", param="size") from None
    return height, width


def _png(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
