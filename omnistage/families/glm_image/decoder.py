"""`GlmImageDecoder`: GLM-Image's diffusion decoder (`GlmImagePipeline` minus its AR prior).

GLM-Image draws in two halves. An autoregressive prior (`vision_language_encoder/`, run
by an upstream AR stage on our own engine) writes image tokens on a grid of 32x32-pixel
cells: first a small *preview* grid, then the *large* grid of the target size, then an
end token. This module is the other half, diffusers' components driven the way
`GlmImagePipeline.__call__` drives them for text-to-image:

    prior tokens ──large grid, upsampled 2x──▶ prior_token_id ┐
    prompt ──'quoted' texts──▶ ByT5 + T5 glyph encoder ───────┼─▶ GlmImageTransformer2DModel
    noise latents, timestep - 1, target size, crop (0, 0) ────┘      (velocity, CFG)
    FlowMatchEulerDiscreteScheduler (shifted by mu) ─▶ AutoencoderKL ─▶ uint8 pixels

The unconditional branch of guidance (scale > 1) drops the prior tokens
(`prior_token_drop`) and uses the negative prompt's glyph embeddings (the pipeline's
negative prompt is always ""; ours is the request's `negative_prompt`, "" by default).

Batching: every request's conditional row and every guided request's unconditional row go
through the transformer together, except that rows whose glyph sequences differ in length
cannot share a call — diffusers' `attention_mask` for the text stream is turned into a
float 0/1 tensor that scaled-dot-product attention *adds* to the scores, so padding with
it would leak the pad tokens into every row. Rows are grouped by glyph length instead
(one call per distinct length; with no quoted text every glyph sequence is one token, so
a typical batch is one call). Each row then runs the math of the request alone (equal up
to the rounding of batched matmuls).

The checkpoint's layout and limits: `glm_image_checkpoint`; the request's glyph texts
and prior tokens: `glm_image_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.diffusion.model import DiffusionInput, DiffusionLimits, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams
from omnistage.families.glm_image.decoder_checkpoint import (
    check_layout,
    decoder_limits,
    load_tokenizer,
)
from omnistage.families.glm_image.decoder_inputs import (
    count_glyph_tokens,
    glyph_token_ids,
    large_prior_tokens,
)


@dataclass
class GlmImageCondition:
    """A request's conditioning, from `encode` to `predict`."""

    prior_token_ids: torch.Tensor
    """`[1, image tokens]` upsampled large-grid prior tokens."""
    glyph_embeds: torch.Tensor
    """`[1, glyph tokens, text dim]` glyph-encoder output of the prompt's quoted texts."""
    negative_glyph_embeds: torch.Tensor | None
    """The negative prompt's (only for requests using guidance)."""
    size: tuple[int, int]
    """(height, width) in pixels: the transformer's `target_size` condition."""


class GlmImageDecoder(DiffusionModel):
    pipeline_class_names = ("GlmImagePipeline",)
    needs_prior_tokens = True

    def __init__(
        self,
        tokenizer: Any,
        text_encoder: Any,
        transformer: Any,
        vae: Any,
        scheduler_config: dict[str, Any],
        limits: DiffusionLimits,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        from diffusers.image_processor import VaeImageProcessor

        self.tokenizer, self.text_encoder = tokenizer, text_encoder
        self.transformer, self.vae = transformer, vae
        self.scheduler_config = scheduler_config
        self.vae_scale = 2 ** (len(vae.config.block_out_channels) - 1)
        self.latent_channels = int(transformer.config.in_channels)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale)
        for name in ("default_height", "default_width", "default_steps", "default_guidance"):
            setattr(self, name, getattr(limits, name))
        for name in ("min_size", "max_size", "size_multiple", "max_text_tokens"):
            setattr(self, name, getattr(limits, name))
        self.device, self.dtype = device, dtype
        if vae.config.latents_mean is None or vae.config.latents_std is None:
            raise ValueError("vae: GLM-Image's VAE config must give latents_mean and latents_std")

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype, device: torch.device) -> GlmImageDecoder:
        from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler
        from diffusers import GlmImageTransformer2DModel as Transformer
        from transformers import T5EncoderModel

        path = Path(path)
        index = check_layout(path)
        tokenizer = load_tokenizer(path, index)

        def ready(module: torch.nn.Module) -> Any:
            return module.to(device=device).eval().requires_grad_(False)

        return cls(
            tokenizer=tokenizer,
            text_encoder=ready(T5EncoderModel.from_pretrained(path / "text_encoder", dtype=dtype)),
            transformer=ready(
                Transformer.from_pretrained(
                    path / "transformer", dtype=dtype, low_cpu_mem_usage=False
                )
            ),
            vae=ready(
                AutoencoderKL.from_pretrained(path / "vae", dtype=dtype, low_cpu_mem_usage=False)
            ),
            scheduler_config=dict(FlowMatchEulerDiscreteScheduler.load_config(path / "scheduler")),
            limits=decoder_limits(path, tokenizer),
            device=device,
            dtype=dtype,
        )

    @classmethod
    def read_limits(cls, path: Path) -> DiffusionLimits:
        path = Path(path)
        return decoder_limits(path, load_tokenizer(path, check_layout(path)))

    # -- text -----------------------------------------------------------------------------------
    def count_text_tokens(self, prompt: str) -> int:
        """Glyph-encoder tokens of the prompt's quoted texts (what the transformer's text
        stream holds). The pipeline truncates each text to `max_sequence_length`; we refuse
        prompts over it in total instead, so nothing is ever cut silently."""
        return count_glyph_tokens(self.tokenizer, prompt)

    @torch.inference_mode()
    def _glyph_embeds(self, prompt: str) -> torch.Tensor:
        """`[1, glyph tokens, dim]`: `GlmImagePipeline._get_glyph_embeds` for one prompt."""
        rows = glyph_token_ids(self.tokenizer, prompt, self.max_text_tokens)
        longest = max(len(row) for row in rows)
        pad = self.tokenizer.pad_token_id
        mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in rows])
        ids = torch.tensor([r + [pad] * (longest - len(r)) for r in rows])
        mask, ids = mask.to(self.device), ids.to(self.device)
        hidden = self.text_encoder(ids, attention_mask=mask).last_hidden_state
        return hidden[mask.bool()].unsqueeze(0).to(self.dtype)

    def encode(self, inputs: list[DiffusionInput]) -> list[GlmImageCondition]:
        vocab = self.transformer.config.prior_vq_quantizer_codebook_size
        conditions = []
        for item in inputs:
            params = item.params
            negative = None
            if params.uses_guidance:
                n = self.count_text_tokens(params.negative_prompt)
                if n > self.max_text_tokens:
                    raise ValueError(
                        f"negative_prompt: {n} glyph-encoder tokens; at most {self.max_text_tokens}"
                    )
                negative = self._glyph_embeds(params.negative_prompt)
            prior = large_prior_tokens(item.prior_token_ids, params.height, params.width, vocab)
            conditions.append(
                GlmImageCondition(
                    prior_token_ids=prior.to(self.device),
                    glyph_embeds=self._glyph_embeds(item.prompt),
                    negative_glyph_embeds=negative,
                    size=(params.height, params.width),
                )
            )
        return conditions

    # -- denoising ------------------------------------------------------------------------------
    def new_scheduler(self, params: ResolvedDiffusionParams) -> Any:
        """The pipeline's schedule: integer timesteps from `num_train_timesteps` down, sigmas
        = timesteps / num_train_timesteps, shifted by `mu` = `calculate_shift(image tokens)`."""
        from diffusers import FlowMatchEulerDiscreteScheduler
        from diffusers.pipelines.glm_image.pipeline_glm_image import (
            calculate_shift,
            retrieve_timesteps,
        )

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        config = scheduler.config
        steps = params.num_inference_steps
        patch = self.transformer.config.patch_size
        image_seq_len = (
            (params.height // self.vae_scale) * (params.width // self.vae_scale) // patch**2
        )
        timesteps = np.linspace(config.num_train_timesteps, 1.0, steps + 1)[:-1]
        timesteps = timesteps.astype(np.int64).astype(np.float32)
        sigmas = timesteps / config.num_train_timesteps
        mu = calculate_shift(
            image_seq_len,
            config.get("base_image_seq_len", 256),
            config.get("base_shift", 0.25),
            config.get("max_shift", 0.75),
        )
        retrieve_timesteps(scheduler, steps, self.device, timesteps, sigmas, mu=mu)
        return scheduler

    @torch.inference_mode()
    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[GlmImageCondition],
        guidance_scales: list[float],
    ) -> torch.Tensor:
        """float32 velocities (the pipeline's `.float()`), guidance combined as the pipeline:
        `uncond + scale * (cond - uncond)`."""
        batch = len(conditions)
        # rows: (request, glyph embeddings, prior dropped); conditional rows first
        rows = [(i, c.glyph_embeds, False) for i, c in enumerate(conditions)]
        for i, scale in enumerate(guidance_scales):
            if scale > 1.0:
                negative = conditions[i].negative_glyph_embeds
                if negative is None:
                    raise ValueError(f"guidance_scale: row {i} was encoded without guidance")
                rows.append((i, negative, True))
        groups: dict[int, list[int]] = {}
        for k, (_, embeds, _) in enumerate(rows):
            groups.setdefault(embeds.shape[1], []).append(k)
        out: list[torch.Tensor | None] = [None] * len(rows)
        for members in groups.values():
            result = self._transformer([rows[k] for k in members], latents, timesteps, conditions)
            for k, row in zip(members, result, strict=True):
                out[k] = row
        pred = torch.stack(out[:batch])
        for k, (i, _, _) in enumerate(rows[batch:], start=batch):
            uncond = out[k]
            pred[i] = uncond + guidance_scales[i] * (pred[i] - uncond)
        return pred

    def _transformer(
        self,
        rows: list[tuple[int, torch.Tensor, bool]],
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[GlmImageCondition],
    ) -> torch.Tensor:
        """One transformer call over `rows` (equal glyph lengths), as the pipeline calls it."""
        index = [i for i, _, _ in rows]
        prior = torch.cat([conditions[i].prior_token_ids for i in index])
        drop = torch.cat(
            [
                torch.full_like(conditions[i].prior_token_ids, d, dtype=torch.bool)
                for i, _, d in rows
            ]
        )
        sizes = [conditions[i].size for i in index]
        device = self.device
        return self.transformer(
            hidden_states=latents[index].to(device, self.transformer.dtype),
            encoder_hidden_states=torch.cat([embeds for _, embeds, _ in rows]),
            prior_token_id=prior,
            prior_token_drop=drop,
            timestep=timesteps[index].to(device, torch.float32) - 1,
            target_size=torch.tensor(sizes, dtype=self.dtype, device=device),
            crop_coords=torch.zeros((len(rows), 2), dtype=self.dtype, device=device),
            return_dict=False,
        )[0].float()

    # -- pixels ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def decode_float(self, latents: torch.Tensor) -> np.ndarray:
        """`[B, H, W, 3]` float32 in [0, 1]: the pipeline's `output_type="np"` image."""
        latents = latents.to(self.device, self.vae.dtype)
        shape = (1, self.vae.config.latent_channels, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(latents)
        std = torch.tensor(self.vae.config.latents_std).view(shape).to(latents)
        image = self.vae.decode(latents * std + mean, return_dict=False)[0]
        return self.image_processor.postprocess(image, output_type="np")

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """`[B, H, W, 3]` uint8, rounded as `VaeImageProcessor.numpy_to_pil`."""
        return torch.from_numpy((self.decode_float(latents) * 255).round().astype("uint8"))
