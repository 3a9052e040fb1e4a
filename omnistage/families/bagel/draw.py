"""`BagelDraw`: Bagel's denoising stage as a `DiffusionModel` the diffusion engine runs.

One request's state is its KV contexts (`text_to_image.Contexts`) and the layout of its
image block; its latents are `[h, w, patch]` (a patch of `latent_patch_size`² latent
pixels of every channel per token: the reference's packed noise, drawn from the
request's seed alone). A request's conditioning is, in order of preference:

- a thinking request's rows (prompt and thinking) and ids: `thinking.thinking_contexts`;
- the prompt's KV rows an upstream understanding stage handed off
  (`DiffusionInput.kv_context`, see `edges.BagelPromptKV`): the context is those rows,
  its next RoPE position their count less what the input images' blocks share
  (`BagelHandOff.layout`);
- else (the denoising stage alone) the prompt prefilled here, as the reference does.

With guidance (`guidance_scale` > 1: the reference's `cfg_text_scale`), the context
without the text is the image blocks' rows (none for text-to-image: the empty context
at position 0), and the context without the images (an edit's) is the text prefilled
here alone, as the reference's inferencer builds them. `num_inference_steps` counts Euler steps (the reference's
`num_timesteps` is one more: its schedule's points). The rest of the reference's
settings are per request, in `DiffusionParams.model_options` (`flow.OPTIONS`:
`cfg_img_scale`, `cfg_interval`, `cfg_renorm_type`, `cfg_renorm_min`,
`timestep_shift`; defaults: the inferencer's text-to-image ones). Each request is evaluated on its
own (its contexts differ in length), so its image does not depend on its batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from omnistage.diffusion.model import DiffusionInput, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams
from omnistage.families.bagel.context import from_rows
from omnistage.families.bagel.edges import BagelHandOff
from omnistage.families.bagel.flow import (
    OPTIONS,
    FlowEulerScheduler,
    read_options,
    settings_of,
)
from omnistage.families.bagel.generator import ImageBlock
from omnistage.families.bagel.layout import PIPELINE_CLASS
from omnistage.families.bagel.text_to_image import BagelImageModel, Contexts
from omnistage.families.bagel.thinking import thinking_contexts, thought

DEFAULT_STEPS = 49
"""The inferencer's `num_timesteps=50` schedule points."""
DEFAULT_GUIDANCE = 4.0
"""The inferencer's text-to-image `cfg_text_scale`."""
MAX_TEXT_TOKENS = 4096


class BagelDraw(DiffusionModel):
    pipeline_class_names = (PIPELINE_CLASS,)
    option_names = OPTIONS

    def __init__(self, model: BagelImageModel, device: torch.device) -> None:
        self.model = model
        self.dtype = model.dtype
        self.device = device
        config = model.config
        self.down = config.latent_downsample
        self.patch_dim = config.patch_latent_dim
        self.max_size = config.max_latent_size * self.down
        self.default_height = self.default_width = self.max_size
        self.min_size = self.size_multiple = self.down
        self.default_steps = DEFAULT_STEPS
        self.default_guidance = DEFAULT_GUIDANCE
        self.max_text_tokens = MAX_TEXT_TOKENS

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype, device: torch.device) -> BagelDraw:
        return cls(BagelImageModel(path, dtype), device)

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """`model_options`: the reference's `cfg_img_scale`, `cfg_interval`,
        `cfg_renorm_type`, `cfg_renorm_min` and `timestep_shift` (`flow.read_options`)."""
        return read_options(options, self.model.config.timestep_shift)

    def count_text_tokens(self, prompt: str) -> int:
        return len(self.model.prompt_ids(prompt))

    def latent_shape(self, params: ResolvedDiffusionParams) -> tuple[int, ...]:
        return (params.height // self.down, params.width // self.down, self.patch_dim)

    def encode(self, inputs: list[DiffusionInput]) -> list[Any]:
        conditions = []
        for item in inputs:
            guidance = item.params.uses_guidance
            if item.kv_context is None:
                contexts = self.model.contexts(item.prompt, guidance)
            else:
                contexts = self.handed_contexts(item.kv_context, item.prompt, guidance)
            options = self.check_options(item.params.model_options)
            conditions.append((contexts, settings_of(options)))
        return conditions

    def handed_contexts(self, hand: BagelHandOff, prompt: str, guidance: bool) -> Contexts:
        """The contexts of a request whose prompt (images, then text) an upstream stage
        prefilled: `hand`'s rows, their prefix of image blocks, and the text alone."""
        if thought(hand.prompt_ids.tolist(), self.model.bos):
            return thinking_contexts(self.model, hand, guidance)
        lm = self.model.language_model
        prefix, blocks = hand.layout(self.model.start_of_image, self.model.end_of_image)
        rows = hand.rows[: hand.prompt_ids.shape[0]].to(self.dtype)
        shape = (lm.num_layers, lm.num_kv_heads, lm.head_dim)
        full = replace(from_rows(rows, *shape), rope=blocks + rows.shape[0] - prefix)
        if not guidance:
            return Contexts(full)
        no_text = replace(from_rows(rows[:prefix], *shape), rope=blocks)
        no_image = self.model.contexts(prompt, False).full if prefix else None
        return Contexts(full, no_text, no_image)

    def new_scheduler(self, params: ResolvedDiffusionParams) -> FlowEulerScheduler:
        shift = self.check_options(params.model_options)["timestep_shift"]
        return FlowEulerScheduler(params.num_inference_steps, shift)

    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[Any],
        guidance_scales: list[float],
        pad_rows_to: int = 0,
    ) -> torch.Tensor:
        out = []
        for x, t, (contexts, settings), scale in zip(
            latents, timesteps, conditions, guidance_scales, strict=True
        ):
            block = ImageBlock(x.shape[0], x.shape[1], self.model.config.max_latent_size)
            flat = x.reshape(-1, x.shape[-1])
            v = self.model.velocity(flat, float(t), block, contexts, scale, settings)
            out.append(v.reshape(x.shape))
        return torch.stack(out)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        images = []
        for x in latents:
            block = ImageBlock(x.shape[0], x.shape[1], self.model.config.max_latent_size)
            images.append(self.model.to_pixels(x.reshape(-1, x.shape[-1]), block))
        return torch.stack(images)
