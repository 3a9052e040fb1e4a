"""`HunyuanImage3Pipeline`: HunyuanImage-3's image stage as a `DiffusionModel`.

The upstream autoregressive stage (`model.py`) reads the prompt, thinks, writes the
recaption and `<answer><boi><img_size_B>…`; the edge (`edges.py`) hands this stage the
whole context. Here, per request:

- the context is cut after its last `<boi>` and given the size token and the ratio
  token of the request's size (its `height` x `width` must be one of the model's
  resolution group, `resolution.py`; default base x base), as the reference does when
  it is given an image size; an answer that ended before its `<boi>` (cut by
  `max_tokens`, or a model that wrote no thought) is drawn from what it wrote, with
  `<answer><boi>` appended (the reference's image section after a thought);
- the unconditional context is the same tokens with every text token replaced by
  `<cfg>`, special tokens and positions kept (the reference's tokenizer wrapper puts
  `<cfg>` in place of the text of the sections it marks unconditional; which sections
  those are in its chat template, e.g. role prefixes, is not checked here: it needs
  the real tokenizer);
- an edit's context (a prompt with input images) is drawn after those images: their
  blocks' rows, positions and both-ways attention come with the edge's hand-off
  (`edit_context.py`), the unconditional context keeps them (only text becomes `<cfg>`);
- at admission the context's keys and values (and the unconditional context's, when
  guidance applies) are computed once (`HunyuanImageDenoiser.context_kv`); each step
  then runs only the `<timestep>` and image rows over them;
- `denoise.py` predicts the guided velocity each step, `flow_match.FlowMatchEuler`
  steps the latents, and the VAE decoder (`vae_decoder.py`) makes the pixels.

The checkpoint is the HF folder of the AR stage with a `model_index.json` naming
`OmnistageHunyuanImage3Pipeline` and the drawing defaults (`default_steps`,
`default_guidance`, `flow_shift`); the released checkpoint ships none, so serving it
needs that file added (the tiny checkpoint writes one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.diffusion.model import MODEL_INDEX, DiffusionInput, DiffusionLimits, DiffusionModel
from omnistage.diffusion.params import ResolvedDiffusionParams
from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
from omnistage.families.hunyuan_image3.denoise import (
    ContextKV,
    HunyuanImageDenoiser,
    read_weights,
)
from omnistage.families.hunyuan_image3.edges import HunyuanImageHandOff
from omnistage.families.hunyuan_image3.edit_context import edit_layouts, find_blocks
from omnistage.families.hunyuan_image3.flow_match import FlowMatchEuler
from omnistage.families.hunyuan_image3.resolution import ratio_index
from omnistage.families.hunyuan_image3.tokens import HunyuanTokens, first_eos
from omnistage.families.hunyuan_image3.vae_decoder import VaeDecoder

PIPELINE_CLASS = "OmnistageHunyuanImage3Pipeline"
DEFAULTS = {"default_steps": 50, "default_guidance": 2.5, "flow_shift": 3.0}
"""The reference's generation defaults (`diff_infer_steps`, `diff_guidance_scale`,
`flow_shift` of the released Instruct checkpoint)."""


@dataclass(frozen=True)
class HunyuanLimits(DiffusionLimits):
    base: int = 1024

    def check_size(self, height: int, width: int) -> None:
        ratio_index(self.base, height, width)


@dataclass
class HunyuanCondition:
    context: list[int]
    uncond_context: list[int]
    context_kv: ContextKV
    uncond_kv: ContextKV | None
    """None when guidance does not apply (scale <= 1)."""


class HunyuanImage3Pipeline(DiffusionModel):
    pipeline_class_names = (PIPELINE_CLASS,)
    needs_prior_tokens = True

    def __init__(
        self,
        denoiser: HunyuanImageDenoiser,
        vae: VaeDecoder,
        tokens: HunyuanTokens,
        settings: dict[str, Any],
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        config = denoiser.config
        self.denoiser, self.vae, self.tokens = denoiser, vae, tokens
        self.base = config.image_base_size
        self.latent_channels = int(config.vae["latent_channels"])
        self.vae_down = int(config.vae_downsample_factor[0])
        self.vae_scale = self.vae_down * config.patch_size
        self.default_height = self.default_width = self.base
        self.default_steps = int(settings["default_steps"])
        self.default_guidance = float(settings["default_guidance"])
        self.shift = float(settings["flow_shift"])
        self.min_size, self.max_size = self.base // 2, self.base * 2
        self.size_multiple = self.vae_scale
        self.max_text_tokens = 1 << 30  # the prompt is the upstream context, not text here
        self.device, self.dtype = device, dtype

    @staticmethod
    def _settings(path: Path) -> tuple[HunyuanImage3Config, dict[str, Any]]:
        index = json.loads((path / MODEL_INDEX).read_text())
        config = HunyuanImage3Config(**json.loads((path / "config.json").read_text()))
        return config, {key: index.get(key, value) for key, value in DEFAULTS.items()}

    @classmethod
    def load(cls, path: Path, dtype: torch.dtype, device: torch.device) -> HunyuanImage3Pipeline:
        path = Path(path)
        config, settings = cls._settings(path)
        weights = read_weights(path)
        denoiser = HunyuanImageDenoiser.from_weights(config, weights, dtype)
        denoiser.decoder.to(device)
        denoiser.head.to(device)
        vae = VaeDecoder(config.vae, dtype)
        vae.load(weights)
        tokens = HunyuanTokens.from_checkpoint(path, config.image_base_size, first_eos(config))
        return cls(denoiser, vae.to(device).eval(), tokens, settings, device, dtype)

    @classmethod
    def read_limits(cls, path: Path) -> DiffusionLimits:
        config, settings = cls._settings(Path(path))
        base, scale = config.image_base_size, int(config.vae_downsample_factor[0])
        return HunyuanLimits(
            default_height=base,
            default_width=base,
            default_steps=int(settings["default_steps"]),
            default_guidance=float(settings["default_guidance"]),
            min_size=base // 2,
            max_size=base * 2,
            size_multiple=scale,
            max_text_tokens=1 << 30,
            count_text_tokens=lambda prompt: 0,
            base=base,
        )

    @property
    def limits(self) -> DiffusionLimits:
        return HunyuanLimits(**{**vars(super().limits), "base": self.base})

    def count_text_tokens(self, prompt: str) -> int:
        return 0

    def encode(self, inputs: list[DiffusionInput]) -> list[HunyuanCondition]:
        out = []
        for item in inputs:
            ratio = ratio_index(self.base, item.params.height, item.params.width)
            ids = [int(t) for t in item.prior_token_ids.tolist()]
            hand_off = item.hand_off
            blocks = []
            if isinstance(hand_off, HunyuanImageHandOff) and hand_off.grids is not None:
                prompt = ids[: hand_off.prompt_len]
                blocks = find_blocks(prompt, hand_off.grids, self.tokens, self.base, self.vae_down)
            context = self.image_context(ids, blocks[-1].end + 1 if blocks else 0)
            context += [self.tokens.size, self.tokens.ratios[ratio]]
            uncond = [t if t in self.tokens.specials else self.tokens.cfg for t in context]
            layout = uncond_layout = None
            if blocks:
                if hand_off.rows is None:
                    raise ValueError("image: the hand-off lacks the input image's rows")
                wte = self.denoiser.decoder.wte
                layout, uncond_layout = edit_layouts(context, uncond, hand_off.rows, blocks, wte)
            guided = item.params.guidance_scale > 1.0
            kv = self.denoiser.context_kv(context, self.device, layout)
            uncond_kv = (
                self.denoiser.context_kv(uncond, self.device, uncond_layout) if guided else None
            )
            out.append(HunyuanCondition(context, uncond, kv, uncond_kv))
        return out

    def image_context(self, ids: list[int], start: int = 0) -> list[int]:
        """The context up to and including the image's `<boi>`: the last one from `start`
        (after the prompt's input image blocks, whose `<boi>` open no image to draw)."""
        tokens = self.tokens
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prior_tokens: the context is empty")
        if tokens.boi in ids[start:]:
            return ids[: len(ids) - ids[::-1].index(tokens.boi)]
        while ids and ids[-1] == tokens.eos:
            ids.pop()
        return ids + ([] if ids and ids[-1] == tokens.answer else [tokens.answer]) + [tokens.boi]

    def new_scheduler(self, params: ResolvedDiffusionParams) -> FlowMatchEuler:
        return FlowMatchEuler(params.num_inference_steps, self.shift)

    @torch.no_grad()
    def predict(
        self,
        latents: torch.Tensor,
        timesteps: torch.Tensor,
        conditions: list[HunyuanCondition],
        guidance_scales: list[float],
        pad_rows_to: int = 0,
    ) -> torch.Tensor:
        """Each request alone (its own sequence length): a row never depends on the batch."""
        rows = []
        for i, (condition, scale) in enumerate(zip(conditions, guidance_scales, strict=True)):
            t = timesteps[i : i + 1].to(torch.float32)
            rows.append(
                self.denoiser.guided_velocity(
                    condition.context_kv, condition.uncond_kv, latents[i : i + 1], t, scale
                )
            )
        return torch.cat(rows)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, H, W, 3] uint8, as the reference's `VaeImageProcessor.postprocess` then PIL."""
        image = (self.vae(latents) / 2 + 0.5).clamp(0, 1)
        return (image.permute(0, 2, 3, 1).float().cpu() * 255).round().to(torch.uint8)
