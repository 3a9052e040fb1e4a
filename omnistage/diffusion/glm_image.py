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

Checkpoint: a diffusers-layout directory (`model_index.json` `_class_name:
GlmImagePipeline`); only `transformer/`, `vae/`, `scheduler/`, `text_encoder/` and
`tokenizer/` are read — never `vision_language_encoder/` or `processor/`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.diffusion.model import MODEL_INDEX, DiffusionInput, DiffusionLimits, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams

COMPONENTS = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
PRIOR_CELL = 32
"""Pixels per prior token (the prior processor's `_get_target_shape` factor)."""
PIXELS_PER_PATCH = PRIOR_CELL // 2
"""VAE scale x transformer patch: the prior grid, upsampled 2x, must land on the patches."""
PIPELINE_STEPS = 50
PIPELINE_GUIDANCE = 1.5
PIPELINE_MAX_SEQUENCE_LENGTH = 2048
"""`GlmImagePipeline.__call__` defaults (a test checks them against diffusers)."""
DEFAULT_SAMPLE_SIZE = 128
"""The pipeline's `default_sample_size` when the transformer config has no `sample_size`."""
MAX_SIZE = 2048

_GLYPH_PATTERNS = (r"'([^']*)'", r"\u201c([^\u201c\u201d]*)\u201d", r'"([^"]*)"', r"「([^「」]*)」")


# -- the prompt: glyph texts ----------------------------------------------------------------------
def glyph_texts(prompt: str) -> list[str]:
    """The quoted texts of `prompt` the image should render ('…', “…”, "…", 「…」), in the
    pipeline's order (`GlmImagePipeline.get_glyph_texts`)."""
    return [text for pattern in _GLYPH_PATTERNS for text in re.findall(pattern, prompt)]


def glyph_token_ids(tokenizer: Any, prompt: str, max_length: int | None = None) -> list[list[int]]:
    """One token row per glyph text ([""] when there is none), as `_get_glyph_embeds` feeds
    the glyph encoder. Its quirk is kept: a pad token is prepended to *every* row when the
    *number* of texts is even. `max_length` truncates each row (the pipeline's
    `max_sequence_length`); None leaves them whole."""
    texts = glyph_texts(prompt) or [""]
    truncate = {"max_length": max_length, "truncation": True} if max_length else {}
    rows = tokenizer(texts, **truncate).input_ids
    pad = [tokenizer.pad_token_id] * ((len(rows) + 1) % 2)
    return [pad + row for row in rows]


def count_glyph_tokens(tokenizer: Any, prompt: str) -> int:
    """The length of the glyph sequence `prompt` gives the transformer (untruncated)."""
    return sum(len(row) for row in glyph_token_ids(tokenizer, prompt))


# -- the prior tokens -----------------------------------------------------------------------------
def prior_grids(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(large, preview) prior grids for a text-to-image target of `height` x `width` pixels
    (`GlmImageProcessor._get_target_shape`)."""
    token_h, token_w = height // PRIOR_CELL, width // PRIOR_CELL
    ratio = token_h / token_w
    preview_h = int(math.sqrt(ratio) * (PRIOR_CELL // 2))
    preview_w = int(math.sqrt(1 / ratio) * (PRIOR_CELL // 2))
    return (token_h, token_w), (preview_h, preview_w)


def large_prior_tokens(
    prior_token_ids: torch.Tensor | None, height: int, width: int, vocab_size: int
) -> torch.Tensor:
    """The large-grid tokens of everything the prior generated (preview grid, large grid,
    end token), upsampled 2x: `[1, (height // 16) * (width // 16)]` long, as the pipeline
    hands them to the transformer. ValueError naming `prior_token_ids` when they are
    missing, do not fit the size, or hold ids the transformer cannot embed."""
    from diffusers import GlmImagePipeline

    if prior_token_ids is None:
        raise ValueError("prior_token_ids: GLM-Image needs the prior's image tokens; none given")
    (token_h, token_w), preview = prior_grids(height, width)
    grid_thw = torch.tensor([[1, token_h, token_w], [1, *preview]])
    max_new_tokens, offset, token_h, token_w = GlmImagePipeline._compute_generation_params(
        grid_thw, is_text_to_image=True
    )
    tokens = torch.as_tensor(prior_token_ids).reshape(-1)
    needed = max_new_tokens - 1  # preview + large; the end token may be left off
    if len(tokens) not in (needed, needed + 1):
        raise ValueError(
            f"prior_token_ids: {len(tokens)} tokens, but a {height}x{width} image takes "
            f"{offset} preview + {token_h * token_w} large-grid tokens (+ 1 end token); "
            "was the prior run for another size, or did it stop early?"
        )
    large = GlmImagePipeline._extract_large_image_tokens(
        tokens.long().unsqueeze(0), 0, offset, token_h * token_w
    )
    bad = (large < 0) | (large >= vocab_size)
    if bad.any():
        position = int(bad.nonzero()[0])
        raise ValueError(
            f"prior_token_ids: large-grid token {position} is {int(large[position])}, outside "
            f"the decoder's prior vocabulary of {vocab_size}"
        )
    return GlmImagePipeline._upsample_token_ids(large, token_h, token_w)


# -- checkpoint -----------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path.parent}: GLM-Image decoder checkpoint lacks {path.name}")
    return json.loads(path.read_text())


def _check_layout(path: Path) -> dict[str, Any]:
    index = _read_json(path / MODEL_INDEX)
    missing = [name for name in COMPONENTS if not (path / name).is_dir()]
    if missing:
        raise ValueError(f"{path}: GLM-Image decoder checkpoint lacks {', '.join(missing)}/")
    return index


def _load_tokenizer(path: Path, index: dict[str, Any]) -> Any:
    """The transformers tokenizer class `model_index.json` names (GLM-Image: ByT5Tokenizer);
    AutoTokenizer when it names none (or a class from another library)."""
    import transformers

    library, name = index.get("tokenizer", [None, None])
    cls = getattr(transformers, name) if library == "transformers" else transformers.AutoTokenizer
    return cls.from_pretrained(path / "tokenizer")


def _limits(path: Path, tokenizer: Any) -> DiffusionLimits:
    transformer = _read_json(path / "transformer" / "config.json")
    vae_scale = 2 ** (len(_read_json(path / "vae" / "config.json")["block_out_channels"]) - 1)
    if vae_scale * transformer["patch_size"] != PIXELS_PER_PATCH:
        raise ValueError(
            f"{path}: VAE scale {vae_scale} x patch size {transformer['patch_size']} must be "
            f"{PIXELS_PER_PATCH}, the prior's {PRIOR_CELL}-pixel grid upsampled 2x"
        )
    default_size = transformer.get("sample_size", DEFAULT_SAMPLE_SIZE) * vae_scale
    return DiffusionLimits(
        default_height=default_size,
        default_width=default_size,
        default_steps=PIPELINE_STEPS,
        default_guidance=PIPELINE_GUIDANCE,
        min_size=PRIOR_CELL,
        max_size=MAX_SIZE,
        size_multiple=PRIOR_CELL,
        max_text_tokens=PIPELINE_MAX_SEQUENCE_LENGTH,
        count_text_tokens=lambda prompt: count_glyph_tokens(tokenizer, prompt),
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
        index = _check_layout(path)
        tokenizer = _load_tokenizer(path, index)

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
            limits=_limits(path, tokenizer),
            device=device,
            dtype=dtype,
        )

    @classmethod
    def read_limits(cls, path: Path) -> DiffusionLimits:
        path = Path(path)
        return _limits(path, _load_tokenizer(path, _check_layout(path)))

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
