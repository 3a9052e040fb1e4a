"""POST /v1/images/edits, for pipelines that draw and take an input image (Bagel,
HunyuanImage-3: the image and the text as one user chat turn where the entry stage takes
a chat).

As OpenAI's API, a multipart form: `image` (one file), `prompt`, and optionally `n`,
`size` ("WxH"), `response_format` (`b64_json` only), `model`; extensions read by the
draw stage: `seed`, `num_inference_steps`, `guidance_scale`, `negative_prompt`, and
`extra_args` (a JSON object of the model's own options, e.g. Bagel's
`{"cfg_img_scale": 2.0, "cfg_interval": [0, 1]}`; `model_options.py`; `model_options`, the
name it had here first, is still read).

    curl -F image=@cat.png -F prompt="make it blue" -F size=512x512 .../v1/images/edits
    -> {"created": ..., "data": [{"b64_json": "<PNG>", "revised_prompt": ...}, ...]}

Without `size` the image is drawn at the input's own size (a 400 naming `size` when the
model cannot draw that one). Bad input is a 400 naming the field: no `prompt`, no or
more than one `image`, an image over `MAX_IMAGE_BYTES` or the media pixel bound, one
Pillow cannot decode, `n` outside 1..`MAX_N`, a size the model cannot draw, a number
that is not one. Seeds and concurrency are the generations endpoint's
(`serving_images`).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.model_options import form_extra_args
from omnistage.entrypoints.openai.protocol_media import ImageGenerationResponse
from omnistage.entrypoints.openai.serving import ERROR_RESPONSES, ServingContext
from omnistage.entrypoints.openai.serving_images import ImagesServing

MAX_N = 10
MAX_IMAGE_BYTES = 20 * 1024 * 1024
NUMBERS = {"n": int, "seed": int, "num_inference_steps": int, "guidance_scale": float}


class ImageEditsServing(ImagesServing):
    @classmethod
    def enabled(cls, ctx: ServingContext) -> bool:
        return ctx.client.draws and "image" in ctx.client.input_modalities

    def register(self, router: APIRouter) -> None:
        router.add_api_route(
            "/v1/images/edits",
            self.edit,
            methods=["POST"],
            response_model=ImageGenerationResponse,
            responses=ERROR_RESPONSES,
        )

    async def edit(self, raw: Request) -> JSONResponse:
        form = await raw.form()
        fields = {k: v for k, v in form.multi_items() if k not in ("image", "image[]")}
        if fields.get("model"):
            self.check_model(str(fields["model"]))
        prompt = fields.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise OpenAIError("prompt: a non-empty prompt is required", param="prompt")
        if fields.get("response_format", "b64_json") != "b64_json":
            raise OpenAIError(
                "response_format: only b64_json is served (this server keeps no image files)",
                param="response_format",
            )
        numbers = {k: _number(k, fields[k]) for k in NUMBERS if fields.get(k) not in (None, "")}
        n = numbers.pop("n", 1)
        if not 1 <= n <= MAX_N:
            raise OpenAIError(f"n: expected 1 to {MAX_N} images, got {n}", param="n")
        image = await self.read_image(form.getlist("image") + form.getlist("image[]"))
        if fields.get("size"):
            height, width = self.parse_size(str(fields["size"]))
        else:
            height, width = self.input_size(image)
        seed = numbers.pop("seed", None)
        seeds: list[int | None] = [None] if n == 1 else [secrets.randbelow(2**62) for _ in range(n)]
        if seed is not None:
            seeds = [seed + i for i in range(n)]
        draw_fields: dict[str, Any] = {"height": height, "width": width, **numbers}
        draw_fields["negative_prompt"] = fields.get("negative_prompt") or None
        options = form_extra_args(fields, self.client)
        draw_fields["model_options"] = options.draw or None
        entry = self.edit_prompt(prompt, image)
        return await self.draw_all(raw, entry, prompt, draw_fields, seeds, options.entry)

    def edit_prompt(self, text: str, image: Any) -> Any:
        """The entry stage's prompt: the text and the image as they are where the entry
        stage renders its own prompt (Bagel's), else the user's chat turn [image, text],
        rendered with the entry model's chat template (HunyuanImage-3's thinker)."""
        if self.client.entry_builds_its_prompt:
            return {"prompt": text, "multi_modal_data": {"image": image}}
        parts = [{"type": "image", "image": image}, {"type": "text", "text": text}]
        return {"messages": [{"role": "user", "content": parts}]}

    async def read_image(self, files: list[Any]) -> Any:
        """The one uploaded image, decoded ([H, W, C] uint8)."""
        import numpy as np

        from omnistage.multimodal.media import load_image

        if len(files) != 1 or isinstance(files[0], str):
            raise OpenAIError(
                f"image: expected one image file, got {len(files)} items", param="image"
            )
        data = await files[0].read(MAX_IMAGE_BYTES + 1)
        if len(data) > MAX_IMAGE_BYTES:
            raise OpenAIError(f"image: larger than {MAX_IMAGE_BYTES} bytes", param="image")
        try:
            decoded = await asyncio.to_thread(load_image, data)
        except ValueError as exc:
            raise OpenAIError(str(exc), param="image") from None
        return np.array(decoded.convert("RGB"), dtype=np.uint8)

    def input_size(self, image: Any) -> tuple[int, int]:
        height, width = image.shape[:2]
        limits = self.client.diffusion_limits
        if limits is not None:
            try:
                limits.check_size(height, width)
            except ValueError as exc:
                raise OpenAIError(
                    f"size: the input image is {width}x{height}, which this model cannot draw "
                    f"({exc}); give a size",
                    param="size",
                ) from None
        return height, width


def _number(name: str, value: Any) -> int | float:
    kind = NUMBERS[name]
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise OpenAIError(f"{name}: expected a number, got {value!r}", param=name) from None
    if kind is int and str(number) != str(value).strip():
        raise OpenAIError(f"{name}: expected an integer, got {value!r}", param=name)
    return number
