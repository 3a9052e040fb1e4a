"""Bagel whole: inputs -> KV contexts -> Euler steps -> VAE -> pixels, or -> greedy text.

`BagelImageModel` loads a checkpoint folder (generator, autoencoder, vision encoder,
tokenizer) and offers the pieces the diffusion stage runs one by one:

- `prompt_ids`: `<|im_start|> prompt <|im_end|>` (the reference's `prepare_prompts`);
- `contexts`: the KV contexts of an interleaved input (texts and images, as the
  reference's `interleave_inference` builds them): the full one; for guidance the one
  without the last text (`no_text`: the context before it) and the one without images
  (`no_image`: the texts alone; for a text-only input that is the full one);
- `answer`: greedy text after a context (the reference's `gen_text`: `<|im_start|>`
  fed first at the context's RoPE position);
- `velocity`: one guided evaluation at one time (up to three passes of the MoT);
- `to_pixels`: latent tokens -> `[H, W, 3]` uint8 (unpatchify, FLUX decoder,
  `(x / 2 + 0.5).clamp(0, 1) * 255` truncated, as the reference's `decode_image`).

`generate` chains them for one request (tests and the reference parity check); an
input image makes it an edit, drawn at the image's (resized) size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.families.bagel.autoencoder import AutoEncoder
from omnistage.families.bagel.config import SPECIAL_TOKENS, VIT_CONFIG, BagelConfig
from omnistage.families.bagel.context import KVContext
from omnistage.families.bagel.flow import FlowEulerScheduler, GuidanceSettings, guided
from omnistage.families.bagel.generator import BagelGenerator, ImageBlock
from omnistage.families.bagel.image_input import ImageBounds, vae_block, vit_block
from omnistage.families.bagel.vision import BagelVision


@dataclass
class Contexts:
    """The KV contexts of one request: the full one and those guidance leaves things out of."""

    full: KVContext
    no_text: KVContext | None = None
    """Without the prompt (None: no text guidance)."""
    no_image: KVContext | None = None
    """Without input images; None: the same as `full` (text-to-image has no input image)."""


class BagelImageModel:
    def __init__(self, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoTokenizer

        self.path = Path(path)
        self.config = BagelConfig.load(self.path)
        self.dtype = dtype
        self.generator = BagelGenerator.load(self.path, self.config, dtype)
        self.vae = AutoEncoder.load(self.path, self.config.vae, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(
            str(self.path), config=self.config.llm, local_files_only=True
        )
        ids = [self.tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS]
        if any(i is None or i == self.tokenizer.unk_token_id for i in ids):
            raise ValueError(f"{self.path}: the tokenizer lacks one of {', '.join(SPECIAL_TOKENS)}")
        self.bos, self.eos, self.start_of_image, self.end_of_image = ids
        down = self.config.latent_downsample
        self.vae_bounds = ImageBounds(*self.config.vae_image_sizes, down)
        self.vision: BagelVision | None = None
        if (self.path / VIT_CONFIG).is_file():
            self.vision = BagelVision.load(self.path, self.config, dtype)
            self.vit_bounds = ImageBounds(*self.config.vit_image_sizes, self.vision.patch)

    @property
    def language_model(self):
        return self.generator.language_model

    def prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos, *self.tokenizer.encode(prompt, add_special_tokens=False), self.eos]

    def contexts(
        self,
        inputs: str | list[Any],
        guidance: bool,
        understanding: bool = False,
        encode_noise: torch.Tensor | None = None,
    ) -> Contexts:
        """The contexts of `inputs` (a prompt, or texts and images in order: the reference's
        `interleave_inference` without thinking). An image adds its VAE block (not for
        `understanding`, posterior sampled with `encode_noise`) and its ViT block."""
        lm = self.language_model
        full = no_text = no_image = lm.empty_context()
        has_image = False
        for item in [inputs] if isinstance(inputs, str) else inputs:
            if isinstance(item, str):
                no_text = full
                ids = torch.tensor(self.prompt_ids(item))
                full = lm.prefill(ids, full)[1]
                no_image = lm.prefill(ids, no_image)[1] if has_image else full
            else:
                full = self.add_image(item, full, understanding, encode_noise)
                no_text, has_image = full, True
        return Contexts(
            full, no_text if guidance else None, no_image if guidance and has_image else None
        )

    def add_image(
        self,
        image: Any,
        context: KVContext,
        understanding: bool,
        encode_noise: torch.Tensor | None,
    ) -> KVContext:
        """`context` grown by `image`'s VAE block (unless `understanding`) and ViT block."""
        if self.vision is None:
            raise ValueError(f"image: {self.path} has no vision encoder ({VIT_CONFIG})")
        image = self.vae_bounds.resize(image)
        markers = (self.start_of_image, self.end_of_image)
        if not understanding:
            pixels = self.vae_bounds.to_pixels(image)
            context = vae_block(self.generator, self.vae, pixels, markers, context, encode_noise)
        pixels = self.vit_bounds.to_pixels(image)
        return vit_block(self.generator, self.vision, pixels, markers, context)

    def answer(self, context: KVContext, max_new_tokens: int) -> list[int]:
        """Greedy ids after `context` (`<|im_start|>` fed first, at `context.rope`), up to
        `max_new_tokens` of them or up to `<|im_end|>` (not included), as the reference's
        `generate_text` with `do_sample=False` (whose `max_length` counts the start token)."""
        lm, out = self.language_model, []
        token = self.bos
        while len(out) < max_new_tokens:
            hidden, context = lm.prefill(torch.tensor([token]), context)
            token = int(lm.compute_logits(hidden[-1]).argmax())
            if token == self.eos:
                break
            out.append(token)
        return out

    def velocity(
        self,
        x_t: torch.Tensor,
        t: float,
        block: ImageBlock,
        contexts: Contexts,
        text_scale: float,
        settings: GuidanceSettings,
    ) -> torch.Tensor:
        """The guided velocity of one request's latents `[tokens, patch]` at time `t`."""
        markers = (self.start_of_image, self.end_of_image)
        scales = settings.scales(t, text_scale)
        v = self.generator.velocity(x_t, t, block, markers, contexts.full)
        if scales[0] <= 1.0 or contexts.no_text is None:
            return v
        v_text = self.generator.velocity(x_t, t, block, markers, contexts.no_text)
        v_img = None
        if scales[1] > 1.0:
            no_image = contexts.no_image
            v_img = (
                v if no_image is None else self.generator.velocity(x_t, t, block, markers, no_image)
            )
        return guided(v, v_text, v_img, scales, settings)

    def to_pixels(self, latents: torch.Tensor, block: ImageBlock) -> torch.Tensor:
        """Latent tokens `[h * w, p * p * c]` -> `[H, W, 3]` uint8."""
        p, c = self.config.latent_patch_size, self.config.vae.z_channels
        z = latents.reshape(1, block.h, block.w, p, p, c)
        z = torch.einsum("nhwpqc->nchpwq", z).reshape(1, c, block.h * p, block.w * p)
        image = self.vae.decode(z.to(self.dtype))
        image = (image * 0.5 + 0.5).clamp(0, 1)[0].permute(1, 2, 0) * 255
        return image.to(torch.uint8)

    def generate(
        self,
        prompt: str | list[Any],
        height: int,
        width: int,
        steps: int,
        noise: torch.Tensor,
        text_scale: float = 1.0,
        settings: GuidanceSettings | None = None,
        shift: float | None = None,
        encode_noise: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(final latents, `[H, W, 3]` uint8 image) from `noise` `[tokens, patch]`; `prompt`
        a text or interleaved texts and images (`contexts`)."""
        settings = settings or GuidanceSettings()
        block = self.generator.block(height, width)
        contexts = self.contexts(prompt, text_scale > 1.0, encode_noise=encode_noise)
        scheduler = FlowEulerScheduler(
            steps, self.config.timestep_shift if shift is None else shift
        )
        x = noise
        for t in scheduler.timesteps:
            v = self.velocity(x, float(t), block, contexts, text_scale, settings)
            x = scheduler.step(v, t, x)[0]
        return x, self.to_pixels(x, block)
