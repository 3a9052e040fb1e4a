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

The context's keys and values are the same at every step (the image tokens come after
it and text is causal), so they are computed once per request (`context_kv`, as the
reference keeps them in its cache after the first step) and each step runs only the
`<timestep>` and image rows over them (`velocity` given a `ContextKV`). Given the token
ids instead, a step recomputes the whole sequence: the same numbers up to float rounding
(`tests/models/test_hunyuan_image3_kv_reuse.py`), kept to prove it.

An edit's context holds input images (`ContextLayout`): their blocks' rows are the
encoders' (handed over by the upstream stage), their runs take 2-D positions and see each
other both ways, as in the thinker's prompt; the image drawn after them is laid out as
above (its positions and mask do not depend on what the context holds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from omnistage.families.hunyuan_image3.config import HunyuanImage3Config
from omnistage.families.hunyuan_image3.flow_match import FlowMatchEuler
from omnistage.families.hunyuan_image3.image_head import ImageHead
from omnistage.families.hunyuan_image3.image_input import ImageSection, section_positions
from omnistage.families.hunyuan_image3.layers import KV
from omnistage.families.hunyuan_image3.model import HunyuanImage3Model
from omnistage.families.hunyuan_image3.rope2d import (
    context_mask,
    denoise_mask,
    image_positions,
    rope_tables,
)


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


@dataclass
class ContextKV:
    """Every decoder layer's keys and values of one context (rotated and normed)."""

    length: int
    layers: list[KV] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


@dataclass(frozen=True)
class ContextLayout:
    """A context with input images: its input rows and where its image runs are."""

    rows: torch.Tensor
    """[len(context), hidden]: the decoder's input rows (an image's are its encoders')."""
    sections: tuple[ImageSection, ...] = ()
    """Each image run (VAE latents, ViT patches), in order: its 2-D positions."""
    spans: tuple[tuple[int, int], ...] = ()
    """[start, end) of each input image's block of runs: they see each other both ways."""


Context = list[int] | ContextKV
"""A context as token ids (recomputed every step) or as its cached keys and values."""


def read_weights(path: Path, prefixes: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The tensors of the checkpoint folder's safetensors files, by name: every one, or
    those whose names start with one of `prefixes` (the others are not read)."""
    weights: dict[str, torch.Tensor] = {}
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no safetensors files")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                if not prefixes or name.startswith(prefixes):
                    weights[name] = f.get_tensor(name)
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

    def _tables(
        self, seq_len: int, start: int, h: int, w: int, first: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and mask of rows [first, seq_len) of a step's sequence whose h x w image
        tokens start at `start`."""
        dtype = self.decoder.ln_f.weight.dtype
        positions = image_positions(seq_len, start, h, w)[first:]
        cos, sin = rope_tables(positions, self.head_dim, self.rope_theta, dtype)
        mask = denoise_mask(seq_len, start, h * w)[first:]
        return cos.to(device), sin.to(device), mask.to(device)

    @torch.no_grad()
    def context_kv(
        self, context: list[int], device: torch.device, layout: ContextLayout | None = None
    ) -> ContextKV:
        """The keys and values of every layer over `context`: what each denoising step
        attends to. Without a `layout`: causal text, plain positions, rows `wte(context)`;
        with one, its rows, image positions and image spans. The last layer's rows need no
        output."""
        n = len(context)
        if layout is None:
            ids = torch.tensor(context, dtype=torch.int64, device=device)
            x = self.decoder.wte(ids)
            cos, sin, mask = self._tables(n, n, 0, 0, 0, device)
        else:
            if layout.rows.shape[0] != n:
                raise ValueError(f"context: {layout.rows.shape[0]} rows for {n} tokens")
            x = layout.rows.to(device=device, dtype=self.decoder.ln_f.weight.dtype)
            positions = section_positions(n, list(layout.sections))
            cos, sin = rope_tables(positions, self.head_dim, self.rope_theta, x.dtype)
            cos, sin = cos.to(device), sin.to(device)
            mask = context_mask(n, layout.spans).to(device)
        cached = ContextKV(len(context))
        *layers, last = self.decoder.layers
        for layer in layers:
            x, kv = layer.dense(x, cos, sin, mask)
            cached.layers.append(kv)
        _, k, v = last.self_attn.rotated_qkv(last.input_layernorm(x), cos, sin)
        cached.layers.append((k, v))
        return cached

    def velocity(self, context: Context, latents: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """[1, C, h, w] latents at time `t` ([1], sigma * 1000) -> [1, C, h, w] velocity."""
        _, _, h, w = latents.shape
        dtype = self.decoder.ln_f.weight.dtype
        image_rows = self.head.patch_embed(latents.to(dtype), self.head.time_embed(t))[0]
        x = torch.cat([self.head.timestep_emb(t), image_rows])
        cached = isinstance(context, ContextKV)
        length = context.length if cached else len(context)
        if not cached:
            ids = torch.tensor(context, dtype=torch.int64, device=latents.device)
            x = torch.cat([self.decoder.wte(ids), x])
        start, n = length + 1, h * w
        first = length if cached else 0
        cos, sin, mask = self._tables(length + 1 + n, start, h, w, first, latents.device)
        for i, layer in enumerate(self.decoder.layers):
            x, _ = layer.dense(x, cos, sin, mask, context.layers[i] if cached else None)
        rows = x[None, start - first : start - first + n]
        return self.head.final_layer(rows, self.head.time_embed_2(t), h, w)

    def guided_velocity(
        self,
        context: Context,
        uncond_context: Context | None,
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
    def generate(
        self, request: DenoiseRequest, noise: torch.Tensor, reuse_kv: bool = True
    ) -> torch.Tensor:
        """Denoise `noise` [1, C, token_h, token_w]; returns the final latents. `reuse_kv`:
        the contexts' keys and values computed once (else every step recomputes them)."""
        scheduler = FlowMatchEuler(request.steps, request.shift)
        context: Context = request.context
        uncond: Context | None = request.uncond_context
        if reuse_kv:
            context = self.context_kv(request.context, noise.device)
            if uncond is not None and request.guidance_scale > 1.0:
                uncond = self.context_kv(uncond, noise.device)
        latents = noise
        for t in scheduler.timesteps:
            t = t.reshape(1).to(latents.device)
            v = self.guided_velocity(context, uncond, latents, t, request.guidance_scale)
            latents = scheduler.step(v, t, latents)[0]
        return latents
