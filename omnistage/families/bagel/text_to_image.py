"""Bagel's text-to-image, whole: prompt -> KV contexts -> Euler steps -> VAE -> pixels.

`BagelImageModel` loads a checkpoint folder (generator, autoencoder, tokenizer) and
offers the pieces the diffusion stage runs one by one:

- `prompt_ids`: `<|im_start|> prompt <|im_end|>` (the reference's `prepare_prompts`);
- `contexts`: the prompt's KV context (understanding expert, causal prefill) and,
  for guidance, the context without the text (empty: position 0);
- `velocity`: one guided evaluation at one time (up to three passes of the MoT);
- `to_pixels`: latent tokens -> `[H, W, 3]` uint8 (unpatchify, FLUX decoder,
  `(x / 2 + 0.5).clamp(0, 1) * 255` truncated, as the reference's `decode_image`).

`generate` chains them for one request (tests and the reference parity check).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omnistage.families.bagel.autoencoder import AutoEncoder
from omnistage.families.bagel.config import SPECIAL_TOKENS, BagelConfig
from omnistage.families.bagel.context import KVContext
from omnistage.families.bagel.flow import FlowEulerScheduler, GuidanceSettings, guided
from omnistage.families.bagel.generator import BagelGenerator, ImageBlock


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

    @property
    def language_model(self):
        return self.generator.language_model

    def prompt_ids(self, prompt: str) -> list[int]:
        return [self.bos, *self.tokenizer.encode(prompt, add_special_tokens=False), self.eos]

    def contexts(self, prompt: str, guidance: bool) -> Contexts:
        lm = self.language_model
        empty = lm.empty_context()
        _, full = lm.prefill(torch.tensor(self.prompt_ids(prompt)), empty)
        return Contexts(full, empty if guidance else None)

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
        prompt: str,
        height: int,
        width: int,
        steps: int,
        noise: torch.Tensor,
        text_scale: float = 1.0,
        settings: GuidanceSettings | None = None,
        shift: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(final latents, `[H, W, 3]` uint8 image) from `noise` `[tokens, patch]`."""
        settings = settings or GuidanceSettings()
        block = self.generator.block(height, width)
        contexts = self.contexts(prompt, guidance=text_scale > 1.0)
        scheduler = FlowEulerScheduler(
            steps, self.config.timestep_shift if shift is None else shift
        )
        x = noise
        for t in scheduler.timesteps:
            v = self.velocity(x, float(t), block, contexts, text_scale, settings)
            x = scheduler.step(v, t, x)[0]
        return x, self.to_pixels(x, block)
