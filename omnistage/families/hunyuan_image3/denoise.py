"""HunyuanImage-3's image generation: its decoder denoises the image's latent tokens in the
context the autoregressive stage wrote, then the VAE would decode them.

The sequence of one denoising step is the context (prompt, thought, recaption and the
`<answer><boi><img_size_B><img_ratio_r>` the sampler forced), the `<timestep>` token
and the image's h x w latent tokens:

    context ... <boi> <img_size> <img_ratio> | <timestep> | img img ... img
                                               time row     patch_embed(latents)

(the reference's gen_image layout, `use_front_boi_token`, `add_timestep_token`,
`add_image_shape_token`). The decoder runs the whole sequence with the 2-D RoPE and
the image-bidirectional mask (`rope2d.py`); its last-layer rows of the image tokens
(no `ln_f`) go through `final_layer` to the velocity. With guidance > 1 the same is
done for the unconditional context and the two are mixed as the reference's
`ClassifierFreeGuidance` does; Euler steps of `flow_match.py` move the latents.

Every step recomputes the context's rows: the image tokens come after it and text is
causal, so the context's keys and values are the same each step (the reference
keeps them in a cache; the numbers are the same).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
from omnistage.families.hunyuan_image3.flow_match import FlowMatchEuler
from omnistage.families.hunyuan_image3.image_head import ImageHead
from omnistage.families.hunyuan_image3.model import HunyuanImage3Model
from omnistage.families.hunyuan_image3.rope2d import denoise_mask, image_positions, rope_tables


@dataclass(frozen=True)
class DenoiseRequest:
    context: list[int]
    """Token ids up to and including the ratio token."""
    uncond_context: list[int] | None
    """The unconditional context (None: no guidance)."""
    token_h: int
    token_w: int
    steps: int
    guidance_scale: float
    shift: float


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint folder's safetensors files, by name."""
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if not weights:
        raise ValueError(f"{path}: no safetensors files")
    return weights


class HunyuanImageDenoiser:
    def __init__(self, decoder: HunyuanImage3Model, head: ImageHead, config) -> None:
        self.decoder = decoder
        self.head = head
        self.config = config
        self.head_dim = config.attention_head_dim
        self.rope_theta = config.rope_theta

    @classmethod
    def from_checkpoint(cls, path: str | Path, dtype: torch.dtype) -> HunyuanImageDenoiser:
        """The decoder (without `lm_head`) and the image head of a checkpoint folder."""
        path = Path(path)
        config = HunyuanImage3Config(**json.loads((path / "config.json").read_text()))
        return cls.from_weights(config, read_weights(path), dtype)

    @classmethod
    def from_weights(
        cls, config: HunyuanImage3Config, weights: dict[str, torch.Tensor], dtype: torch.dtype
    ) -> HunyuanImageDenoiser:
        decoder = HunyuanImage3Model(config, dtype, config.max_position_embeddings)
        decoder.requires_grad_(False)
        state = {k[len("model.") :]: v for k, v in weights.items() if k.startswith("model.")}
        missing = set(dict(decoder.named_parameters())) - set(state)
        if missing:
            raise ValueError(f"checkpoint: decoder weights missing: {sorted(missing)[:5]}")
        decoder.load_state_dict(state, strict=False)
        head = ImageHead(config, dtype)
        head.load(weights)
        return cls(decoder.eval(), head.eval(), config)

    def velocity(self, context: list[int], latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """[1, C, h, w] latents at time `t` ([1], sigma * 1000) -> [1, C, h, w] velocity."""
        _, _, h, w = latents.shape
        dtype = self.decoder.ln_f.weight.dtype
        ids = torch.tensor(context, dtype=torch.int64, device=latents.device)
        image_rows = self.head.patch_embed(latents.to(dtype), self.head.time_embed(t))[0]
        x = torch.cat([self.decoder.wte(ids), self.head.timestep_emb(t), image_rows])
        start, n = len(context) + 1, h * w
        cos, sin = rope_tables(
            image_positions(x.shape[0], start, h, w), self.head_dim, self.rope_theta, dtype
        )
        mask = denoise_mask(x.shape[0], start, n).to(latents.device)
        cos, sin = cos.to(latents.device), sin.to(latents.device)
        for layer in self.decoder.layers:
            x = layer.dense(x, cos, sin, mask)
        return self.head.final_layer(x[None, start : start + n], self.head.time_embed_2(t), h, w)

    def guided_velocity(
        self,
        context: list[int],
        uncond_context: list[int] | None,
        latents: torch.Tensor,
        t: torch.Tensor,
        guidance_scale: float,
    ) -> torch.Tensor:
        """The velocity of one request, mixed with its unconditional one as the reference's
        `ClassifierFreeGuidance` does when guidance applies (scale > 1)."""
        work = torch.float64 if latents.dtype == torch.float64 else torch.float32
        v = self.velocity(context, latents, t).to(work)
        if uncond_context is None or guidance_scale <= 1.0:
            return v
        v_uncond = self.velocity(uncond_context, latents, t).to(work)
        return v_uncond + guidance_scale * (v - v_uncond)

    @torch.no_grad()
    def generate(self, request: DenoiseRequest, noise: torch.Tensor) -> torch.Tensor:
        """Denoise `noise` [1, C, token_h, token_w]; returns the final latents."""
        scheduler = FlowMatchEuler(request.steps, request.shift)
        latents = noise
        for t in scheduler.timesteps:
            t = t.reshape(1).to(latents.device)
            v = self.guided_velocity(
                request.context, request.uncond_context, latents, t, request.guidance_scale
            )
            latents = scheduler.step(v, t, latents)[0]
        return latents
