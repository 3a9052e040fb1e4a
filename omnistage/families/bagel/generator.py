"""`BagelGenerator`: the MoT language model and the heads that turn it into a velocity field.

Holds the checkpoint's text-to-image weights under their own names:
`language_model` (`mot.MoTLanguageModel`), `time_embedder` (DiT's sinusoidal
timestep MLP), `vae2llm` / `llm2vae` (a latent patch in and out of the model's
width) and `latent_pos_embed` (a fixed 2-D sin-cos table over a
`max_latent_size`-square grid of patches). The vision encoder's weights
(`vit_model.`, `connector.`, `vit_pos_embed.`) are `vision.BagelVision`'s.

`velocity` is one evaluation of the flow: the image block `<|vision_start|>`,
the noisy latent tokens (patch + timestep + position embeddings), `<|vision_end|>`,
after one KV context. `guided` combines the evaluations of classifier-free
guidance as the reference's `_forward_flow` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from omnistage.families.bagel.config import WEIGHTS, BagelConfig
from omnistage.families.bagel.context import KVContext
from omnistage.families.bagel.mot import MoTLanguageModel
from omnistage.layers.linear import Linear

SKIPPED_PREFIXES = ("vit_model.", "connector.", "vit_pos_embed.")
"""Checkpoint weights of the vision encoder (`vision.BagelVision` loads them)."""
FREQUENCY_SIZE = 256
"""The timestep embedder's sinusoid width (DiT's `frequency_embedding_size`)."""


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.mlp = nn.Sequential(
            Linear(FREQUENCY_SIZE, hidden, True, dtype),
            nn.SiLU(),
            Linear(hidden, hidden, True, dtype),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """`[N]` timesteps in [0, 1] -> `[N, hidden]` (the sinusoid in float32, as DiT's)."""
        half = FREQUENCY_SIZE // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        sinusoid = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(sinusoid.to(self.mlp[0].weight.dtype))


class PositionEmbedding(nn.Module):
    def __init__(self, side: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.pos_embed = nn.Parameter(torch.zeros(side * side, hidden, dtype=dtype), False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.pos_embed[position_ids]


def load_checked(model: nn.Module, weights: dict[str, torch.Tensor], source: str) -> nn.Module:
    """`model` with exactly `weights` loaded (cast to its dtype), in eval mode; a missing,
    unknown or misshapen weight is a ValueError naming it and `source`."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    unknown = sorted(set(weights) - set(expected))
    if missing or unknown:
        raise ValueError(
            f"{source}: missing {missing[:3]}, unknown {unknown[:3]} "
            f"({len(missing)} missing, {len(unknown)} unknown)"
        )
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{source}: {name} has shape {list(tensor.shape)}, "
                f"expected {list(expected[name].shape)}"
            )
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in weights.items()})
    return model.eval()


@dataclass(frozen=True)
class ImageBlock:
    """The token layout of one image of `h` x `w` latent patches."""

    h: int
    w: int
    max_side: int

    @property
    def num_tokens(self) -> int:
        return self.h * self.w

    def position_ids(self) -> torch.Tensor:
        """Each patch's row in the position table (the reference's `extrapolate` ids)."""
        return (torch.arange(self.h)[:, None] * self.max_side + torch.arange(self.w)).flatten()


class BagelGenerator(nn.Module):
    def __init__(self, config: BagelConfig, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, patch = config.hidden_size, config.patch_latent_dim
        self.config = config
        self.dtype = dtype
        self.language_model = MoTLanguageModel(config.llm, dtype)
        self.time_embedder = TimestepEmbedder(hidden, dtype)
        self.vae2llm = Linear(patch, hidden, True, dtype)
        self.llm2vae = Linear(hidden, patch, True, dtype)
        self.latent_pos_embed = PositionEmbedding(config.max_latent_size, hidden, dtype)

    @classmethod
    def load(cls, path: str | Path, config: BagelConfig, dtype: torch.dtype) -> BagelGenerator:
        """The generator of checkpoint folder `path` (`ema.safetensors`, every weight it needs
        present: a missing or misshapen one is a ValueError naming it)."""
        from safetensors.torch import load_file

        weights = {
            k: v
            for k, v in load_file(str(Path(path) / WEIGHTS)).items()
            if not k.startswith(SKIPPED_PREFIXES)
        }
        return load_checked(cls(config, dtype), weights, f"{path}/{WEIGHTS}")

    def block(self, height: int, width: int) -> ImageBlock:
        """The token layout of an image of `height` x `width` pixels."""
        down = self.config.latent_downsample
        return ImageBlock(height // down, width // down, self.config.max_latent_size)

    @torch.inference_mode()
    def velocity(
        self,
        x_t: torch.Tensor,
        t: float,
        block: ImageBlock,
        markers: tuple[int, int],
        context: KVContext,
    ) -> torch.Tensor:
        """The flow's velocity `[tokens, patch]` at latents `x_t` and time `t`, after `context`;
        `markers`: the ids of `<|vision_start|>` and `<|vision_end|>`."""
        lm = self.language_model
        ends = lm.model.embed_tokens(torch.tensor(markers))
        timestep = torch.full((x_t.shape[0],), t, dtype=torch.float32)
        latents = (
            self.vae2llm(x_t.to(self.dtype))
            + self.time_embedder(timestep)
            + self.latent_pos_embed(block.position_ids())
        )
        sequence = torch.cat([ends[:1], latents, ends[1:]])
        gen_rows = torch.arange(1, 1 + block.num_tokens)
        hidden = lm.denoise(sequence, gen_rows, context)
        return self.llm2vae(hidden[gen_rows])
