"""Images in chat answers: what a chat request asks of the draw stage, and how a drawn image
is sent back.

The shape is OpenRouter's (also the Vercel AI Gateway's and LiteLLM's, the most used for
image output through chat completions): ask with `modalities: ["text", "image"]` (or
`["image"]`), get `message.images` = `[{"type": "image_url", "image_url": {"url":
"data:image/png;base64,..."}}]` beside the text in `message.content`, or, streamed, one
chunk whose `delta.images` holds them (after the text, before the finish reason).
vLLM-Omni instead puts image parts in `message.content`, which OpenAI's clients type as
a string; we keep `content` the text.

The image fields of the request (`size`, `num_inference_steps`, `guidance_scale`,
`negative_prompt`, as `/v1/images/generations` takes them) and its `seed` become the draw
stage's `DiffusionParams`; bad values are a 400 naming the field.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from omnistage.entrypoints.openai.client import EngineClient
from omnistage.entrypoints.openai.errors import OpenAIError
from omnistage.entrypoints.openai.protocol import ChatCompletionRequest, ChatImage

DRAW_FIELDS = ("size", "num_inference_steps", "guidance_scale", "negative_prompt")


def draw_params(
    body: ChatCompletionRequest, client: EngineClient, wanted: bool, options: Any = None
) -> Any:
    """The draw stage's `DiffusionParams` of a chat whose answer has an image (`wanted`),
    with the draw stage's `options` (`extra_args` it reads), else None; a 400 naming an
    image field or option given without an image to draw, or a bad one."""
    given = [f for f in DRAW_FIELDS if getattr(body, f) is not None] + list(options or {})
    if not wanted:
        if given:
            raise OpenAIError(
                f"{given[0]}: an image field or option needs 'image' in modalities (and a "
                "model that draws)",
                param=given[0],
            )
        return None
    from omnistage.diffusion.params import DiffusionParams
    from omnistage.entrypoints.openai.serving_images import parse_size

    height, width = parse_size(body.size, getattr(client, "diffusion_limits", None))
    fields = {
        "height": height,
        "width": width,
        "num_inference_steps": body.num_inference_steps,
        "guidance_scale": body.guidance_scale,
        "negative_prompt": body.negative_prompt or None,
        "seed": body.seed,
        "model_options": options or None,
    }
    try:
        return DiffusionParams(**{k: v for k, v in fields.items() if v is not None})
    except ValueError as exc:
        raise OpenAIError.from_value_error(exc) from None


def chat_image(image: Any) -> ChatImage:
    """A drawn image (`[H, W, 3]` uint8 array) as a PNG data URL (blocks: run it off the
    event loop)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image, "RGB").save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return ChatImage(image_url={"url": url})
