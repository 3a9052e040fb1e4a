"""`TextDiT`: a text-conditioned diffusion transformer drawn with a flow-matching scheduler.

The drawing half of a think -> recaption -> draw pipeline (the built-in
`demo-image`): a caption is encoded by a T5 encoder (byte-level ByT5
tokenizer, padded to the encoder's fixed length so a request's conditioning
never depends on its batch), a diffusers `PixArtTransformer2DModel`
predicts the flow velocity from the latents, the timestep and the caption
(cross-attention, padding masked), diffusers' `FlowMatchEulerDiscreteScheduler`
steps, and an `AutoencoderKL` decodes.

Checkpoint: a diffusers-layout directory whose `model_index.json` has
`_class_name: OmnistageTextToImagePipeline`, the components `text_encoder/`,
`tokenizer/`, `transformer/`, `vae/`, `scheduler/`, and our settings under
`_omnistage` (`default_size`, `default_steps`, `default_guidance`,
`min_size`, `max_size`, `max_text_tokens`). Other sub-directories (a
`thinker/` for the autoregressive stage) are not read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.diffusion.model import MODEL_INDEX, DiffusionInput, DiffusionLimits, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams

SETTINGS_KEY = "_omnistage"


@dataclass
class _Caption:
    """A request's encoded caption (and negative prompt, when it uses guidance)."""

    embeds: torch.Tensor
    mask: torch.Tensor
    negative_embeds: torch.Tensor | None
    negative_mask: torch.Tensor | None


SETTINGS = (
    "default_size",
    "default_steps",
    "default_guidance",
    "min_size",
    "max_size",
    "max_text_tokens",
)


def _settings(path: Path) -> dict[str, Any]:
    settings = json.loads((path / MODEL_INDEX).read_text()).get(SETTINGS_KEY, {})
    missing = sorted(set(SETTINGS) - set(settings))
    if missing:
        raise ValueError(f"{path / MODEL_INDEX}: {SETTINGS_KEY} lacks {missing}")
    return settings


class TextDiT(DiffusionModel):
    pipeline_class_names = ("OmnistageTextToImagePipeline",)
    supports_padded_rows = True

    def __init__(
        self,
        tokenizer: Any,
        text_encoder: Any,
        transformer: Any,
        vae: Any,
        scheduler_config: dict[str, Any],
        settings: dict[str, Any],
    ) -> None:
        self.tokenizer, self.text_encoder = tokenizer, text_encoder
        self.transformer, self.vae = transformer, vae
        self.scheduler_config = scheduler_config
        self.vae_scale = 2 ** (len(vae.config.block_out_channels) - 1)
        self.latent_channels = int(vae.config.latent_channels)
        self.size_multiple = self.vae_scale * transformer.config.patch_size
        self.default_height = self.default_width = int(settings["default_size"])
        self.default_steps = int(settings["default_steps"])
        self.default_guidance = float(settings["default_guidance"])
        self.min_size = int(settings["min_size"])
        self.max_size = int(settings["max_size"])
        self.max_text_tokens = int(settings["max_text_tokens"])
        self.device = next(transformer.parameters()).device
        self.dtype = next(transformer.parameters()).dtype

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype, device: torch.device) -> TextDiT:
        from diffusers import (
            AutoencoderKL,
            FlowMatchEulerDiscreteScheduler,
            PixArtTransformer2DModel,
        )
        from transformers import AutoTokenizer, T5EncoderModel

        settings = _settings(path)

        def ready(module: torch.nn.Module) -> Any:
            return module.to(device=device).eval().requires_grad_(False)

        diffusers_args = {"dtype": dtype, "low_cpu_mem_usage": False}
        return cls(
            tokenizer=AutoTokenizer.from_pretrained(path / "tokenizer"),
            text_encoder=ready(T5EncoderModel.from_pretrained(path / "text_encoder", dtype=dtype)),
            transformer=ready(
                PixArtTransformer2DModel.from_pretrained(path / "transformer", **diffusers_args)
            ),
            vae=ready(AutoencoderKL.from_pretrained(path / "vae", **diffusers_args)),
            scheduler_config=dict(FlowMatchEulerDiscreteScheduler.load_config(path / "scheduler")),
            settings=settings,
        )

    @classmethod
    def read_limits(cls, path: Path) -> DiffusionLimits:
        from transformers import AutoTokenizer

        settings = _settings(path)
        vae = json.loads((path / "vae" / "config.json").read_text())
        transformer = json.loads((path / "transformer" / "config.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(path / "tokenizer")
        size = int(settings["default_size"])
        return DiffusionLimits(
            default_height=size,
            default_width=size,
            default_steps=int(settings["default_steps"]),
            default_guidance=float(settings["default_guidance"]),
            min_size=int(settings["min_size"]),
            max_size=int(settings["max_size"]),
            size_multiple=2 ** (len(vae["block_out_channels"]) - 1) * transformer["patch_size"],
            max_text_tokens=int(settings["max_text_tokens"]),
            count_text_tokens=lambda prompt: len(tokenizer(prompt).input_ids),
        )

    # -- text ---------------------------------------------------------------------------------
    def count_text_tokens(self, prompt: str) -> int:
        return len(self.tokenizer(prompt).input_ids)

    @torch.inference_mode()
    def _encode_texts(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Every text padded to `max_text_tokens`: the same rows whatever the batch."""
        for text in texts:
            self.check_prompt(text)
        tokens = self.tokenizer(
            texts, padding="max_length", max_length=self.max_text_tokens, return_tensors="pt"
        )
        ids = tokens.input_ids.to(self.device)
        mask = tokens.attention_mask.to(self.device)
        embeds = self.text_encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        return embeds, mask

    def encode(self, inputs: list[DiffusionInput]) -> list[_Caption]:
        texts = [i.prompt for i in inputs]
        texts += [i.params.negative_prompt for i in inputs if i.params.uses_guidance]
        embeds, mask = self._encode_texts(texts)
        out, negative = [], len(inputs)
        for row, item in enumerate(inputs):
            caption = _Caption(embeds[row : row + 1], mask[row : row + 1], None, None)
            if item.params.uses_guidance:
                caption.negative_embeds = embeds[negative : negative + 1]
                caption.negative_mask = mask[negative : negative + 1]
                negative += 1
            out.append(caption)
        return out

    # -- denoising ----------------------------------------------------------------------------
    def new_scheduler(self, params: ResolvedDiffusionParams) -> Any:
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_config(self.scheduler_config)
        scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        return scheduler

    @torch.inference_mode()
    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[_Caption],
        guidance_scales: list[float],
        pad_rows_to: int = 0,
    ) -> torch.Tensor:
        guided = [i for i, g in enumerate(guidance_scales) if g > 1.0]
        fill = [0] * max(0, pad_rows_to - len(conditions) - len(guided))
        rows = torch.cat([latents, latents[guided], latents[fill]])
        steps = torch.cat([timesteps, timesteps[guided], timesteps[fill]]).to(self.dtype)
        embeds = torch.cat(
            [c.embeds for c in conditions]
            + [conditions[i].negative_embeds for i in guided]
            + [conditions[i].embeds for i in fill]
        )
        mask = torch.cat(
            [c.mask for c in conditions]
            + [conditions[i].negative_mask for i in guided]
            + [conditions[i].mask for i in fill]
        )
        out = self.transformer(
            hidden_states=rows,
            encoder_hidden_states=embeds,
            timestep=steps,
            encoder_attention_mask=mask,
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        pred = out[: latents.shape[0]].clone()
        if guided:
            uncond = out[latents.shape[0] : latents.shape[0] + len(guided)]
            scales = torch.tensor([guidance_scales[i] for i in guided], dtype=out.dtype)
            scales = scales.to(out.device).view(-1, *[1] * (out.dim() - 1))
            pred[guided] = uncond + scales * (pred[guided] - uncond)
        return pred

    @torch.inference_mode()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        scaling = float(getattr(self.vae.config, "scaling_factor", 1.0) or 1.0)
        images = self.vae.decode(latents.to(self.dtype) / scaling, return_dict=False)[0]
        images = (images.float() / 2 + 0.5).clamp(0, 1)
        return (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu()
