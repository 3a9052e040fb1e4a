"""Covo-Audio's token2latent: a flow-matching transformer from speech codes to VAE latents.

Parameter names are the reference's (`token2wav/models/token2latent.py`,
`Token2latentFlowMatchingWithEmbed`, under `token2latent.` in `token2wav/model.pt`):
a code embedding, a linear projection and a transposed convolution that upsample
each code to `upsample_factor` latent frames, a time embedder, a speaker projection
into the adaLN condition, a grouped positional convolution, DiT blocks (adaLN-zero
modulation, rotary self-attention over the whole utterance, tanh-GELU MLP) and the
final adaLN layer. The attention has no mask: every latent frame hears every code,
so a frame's latent depends on the whole utterance.

The sampler (`sample`) is the reference's: noise of the utterance's length drawn once,
then a fixed-grid midpoint solve over `steps` points of [0, 1] (torchdiffeq's
`odeint(method="midpoint")`), each evaluation the conditioned and the unconditioned
(codes zeroed) field in one batch of two, mixed with `cfg_alpha`; the prompt's latents
are known and fed as the conditioning latents of the first frames.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.covo_audio.config import DitConfig

_FREQ_DIM = 256
_ROPE_THETA = 50000.0


def _modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(_FREQ_DIM, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = _FREQ_DIM // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs.to(t.device)[None]
        embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return self.mlp(embedding.to(self.mlp[0].weight.dtype))


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden)
        self.rotary = nn.Module()
        inv_freq = 1.0 / (
            _ROPE_THETA ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        )
        self.rotary.register_buffer("inv_freq", inv_freq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        inv_freq = self.rotary.inv_freq
        freqs = torch.outer(torch.arange(n, device=x.device).to(inv_freq.dtype), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1).to(x.dtype)
        q = q * angles.cos() + _rotate_half(q) * angles.sin()
        k = k * angles.cos() + _rotate_half(k) * angles.sin()
        out = F.scaled_dot_product_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class Mlp(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: DitConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.norm1 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(hidden, config.num_heads)
        self.ffn = Mlp(hidden, config.ffn_hidden_size)
        self.modulation_layer = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 6 * hidden))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.modulation_layer(c).chunk(6, 1)
        x = x + gate_a.unsqueeze(1) * self.attn(_modulate(self.norm1(x), shift_a, scale_a))
        return x + gate_f.unsqueeze(1) * self.ffn(_modulate(self.norm2(x), shift_f, scale_f))


class FinalLayer(nn.Module):
    def __init__(self, hidden: int, out: int) -> None:
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden, 2 * hidden))
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(_modulate(self.norm(x), shift, scale))


class ConvPositionEmbed(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(hidden, hidden, 31, padding=15, groups=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.conv(x.transpose(1, 2))).transpose(1, 2)


class Token2Latent(nn.Module):
    def __init__(self, config: DitConfig) -> None:
        super().__init__()
        self.config = config
        hidden, z, up = config.hidden_size, config.z_dim, config.upsample_factor
        self.token_embedding = nn.Embedding(config.token_vocab_size, config.token_input_dim)
        self.token_proj = nn.Sequential(
            nn.Linear(config.token_input_dim, hidden),
            nn.ConvTranspose1d(hidden, hidden, kernel_size=2 * up, stride=up, padding=up // 2),
        )
        self.cond_proj = nn.Linear(hidden + config.spkr_embed_dim, hidden)
        self.transformer_input_proj = nn.Linear(hidden + 2 * z, hidden)
        self.time_embedder = TimestepEmbedder(hidden)
        self.conv_embed = ConvPositionEmbed(hidden)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.output_layer = FinalLayer(hidden, z)

    def embed_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """`[1, n]` codes -> `[1, n * upsample_factor, hidden]` token rows."""
        x = self.token_proj[0](self.token_embedding(codes))
        return self.token_proj[1](x.transpose(1, 2)).transpose(1, 2)

    def field(
        self, inputs: torch.Tensor, times: torch.Tensor, speaker: torch.Tensor
    ) -> torch.Tensor:
        c = self.cond_proj(torch.cat([self.time_embedder(times), speaker], dim=-1))
        x = self.transformer_input_proj(inputs)
        x = self.conv_embed(x) + x
        for block in self.blocks:
            x = block(x, c)
        return self.output_layer(x, c)

    def sample(
        self,
        tokens: torch.Tensor,
        known: torch.Tensor,
        noise: torch.Tensor,
        speaker: torch.Tensor,
        steps: int,
        alpha: float,
    ) -> torch.Tensor:
        """Latents `[1, frames, z]` for token rows `[1, frames, hidden]`, the known latents
        (prompt frames, zeros after) and the starting noise."""
        tokens2 = torch.cat([torch.zeros_like(tokens), tokens])
        known2 = torch.cat([known, known])
        speaker2 = torch.cat([speaker, speaker])

        def f(t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            inputs = torch.cat([tokens2, known2, torch.cat([z, z])], dim=-1)
            mix = self.field(inputs, torch.stack([t, t]), speaker2)
            cond, uncond = mix[1:], mix[:1]
            return cond + (cond - uncond) * alpha

        times = torch.linspace(0, 1, steps, device=noise.device)
        z = noise
        for t0, t1 in zip(times[:-1], times[1:], strict=True):
            dt = (t1 - t0).to(z.dtype)
            half = 0.5 * dt
            z = z + dt * f(t0 + half, z + f(t0, z) * half)
        return z
