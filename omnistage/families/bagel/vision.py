"""Bagel's image-understanding encoder: SigLIP-NaViT, the connector and `vit_pos_embed`.

Under the checkpoint's own names (`vit_model.vision_model.…`, `connector.fc1`,
`vit_pos_embed.pos_embed`), as the reference's `modeling/bagel/siglip_navit.py` builds
them for BAGEL-7B-MoT (`app.py`): SigLIP's vision transformer with 2-D rotary off, its
last layer dropped (`vit_config.json` states one more layer than the checkpoint holds) and
its patch embedding a linear layer over a flattened `(row, column, channel)` patch. An
image is one packed sequence of patches, each with a learned position embedding picked
by its flattened grid index `row * vit_max_num_patch_per_side + column` (the reference's
`extrapolate` ids); attention is full (not causal) within the image.

`BagelVision.embed` turns `[3, H, W]` pixels (normalised to [-1, 1]) into `[patches,
hidden]` language-model embeddings: ViT -> post LayerNorm -> connector (fc1, act, fc2)
-> + `vit_pos_embed` (a fixed 2-D sin-cos table of the language model's width).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.bagel.generator import PositionEmbedding, load_checked
from omnistage.layers.linear import Linear

PREFIXES = ("vit_model.", "connector.", "vit_pos_embed.")


def _act(name: str):
    if name not in ("gelu_pytorch_tanh", "gelu"):
        raise ValueError(f"hidden_act: {name!r} is not supported (gelu_pytorch_tanh, gelu)")
    approximate = "tanh" if name == "gelu_pytorch_tanh" else "none"
    return lambda x: F.gelu(x, approximate=approximate)


def patchify(image: torch.Tensor, patch: int) -> torch.Tensor:
    """`[C, H, W]` -> `[(H / p) * (W / p), p * p * C]`, row-major patches (the reference's
    `patchify`: `chpwq -> hwpqc`)."""
    c, h, w = image.shape
    x = image.reshape(c, h // patch, patch, w // patch, patch)
    return torch.einsum("chpwq->hwpqc", x).reshape(-1, patch * patch * c)


def grid_ids(h: int, w: int, max_side: int) -> torch.Tensor:
    """Flattened grid indices of an `h` x `w` patch grid in a `max_side`-wide table."""
    return (torch.arange(h)[:, None] * max_side + torch.arange(w)).flatten()


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.heads = heads
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, Linear(dim, dim, True, dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        q, k, v = (
            getattr(self, f"{n}_proj")(x).view(t, self.heads, -1).transpose(0, 1) for n in "qkv"
        )
        out = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(t, d)
        return self.out_proj(out)


class _MLP(nn.Module):
    def __init__(self, dim: int, inner: int, act: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = Linear(dim, inner, True, dtype)
        self.fc2 = Linear(inner, dim, True, dtype)
        self.act = _act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _EncoderLayer(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        dim, eps = config.hidden_size, config.layer_norm_eps
        self.layer_norm1 = nn.LayerNorm(dim, eps=eps, dtype=dtype)
        self.self_attn = _Attention(dim, config.num_attention_heads, dtype)
        self.layer_norm2 = nn.LayerNorm(dim, eps=eps, dtype=dtype)
        self.mlp = _MLP(dim, config.intermediate_size, config.hidden_act, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class _Embeddings(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        patch_dim = config.num_channels * config.patch_size**2
        self.patch_embedding = Linear(patch_dim, config.hidden_size, True, dtype)
        side = config.image_size // config.patch_size
        self.position_embedding = nn.Embedding(side * side, config.hidden_size, dtype=dtype)


class _VisionTransformer(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.embeddings = _Embeddings(config, dtype)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            _EncoderLayer(config, dtype) for _ in range(config.num_hidden_layers - 1)
        )
        eps = config.layer_norm_eps
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=eps, dtype=dtype)


class _Connector(nn.Module):
    def __init__(self, vit_hidden: int, hidden: int, act: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc1 = Linear(vit_hidden, hidden, True, dtype)
        self.fc2 = Linear(hidden, hidden, True, dtype)
        self.act = _act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class BagelVision(nn.Module):
    """`vit_model`, `connector` and `vit_pos_embed` of a Bagel checkpoint."""

    def __init__(self, vit_config: Any, hidden: int, max_side: int, act: str, dtype: torch.dtype):
        super().__init__()
        self.patch = vit_config.patch_size
        self.max_side = max_side
        self.dtype = dtype
        self.vit_model = nn.Module()
        self.vit_model.vision_model = _VisionTransformer(vit_config, dtype)
        self.connector = _Connector(vit_config.hidden_size, hidden, act, dtype)
        self.vit_pos_embed = PositionEmbedding(max_side, hidden, dtype)

    @classmethod
    def load(cls, path: Any, config: Any, dtype: torch.dtype) -> BagelVision:
        """The vision encoder of checkpoint folder `path` (`config`: its `BagelConfig`)."""
        from safetensors.torch import load_file

        from omnistage.families.bagel.config import WEIGHTS

        model = cls(
            config.load_vit(path),
            config.hidden_size,
            config.vit_max_num_patch_per_side,
            config.connector_act,
            dtype,
        )
        weights = load_file(str(path / WEIGHTS))
        weights = {k: v for k, v in weights.items() if k.startswith(PREFIXES)}
        return load_checked(model, weights, f"{path}/{WEIGHTS}")

    def grid(self, height: int, width: int) -> tuple[int, int]:
        return height // self.patch, width // self.patch

    @torch.inference_mode()
    def embed(self, pixels: torch.Tensor) -> torch.Tensor:
        """`[3, H, W]` in [-1, 1] (sides multiples of the patch) -> `[patches, hidden]`."""
        h, w = self.grid(pixels.shape[1], pixels.shape[2])
        if h > self.max_side or w > self.max_side:
            raise ValueError(
                f"image: {pixels.shape[1]}x{pixels.shape[2]} pixels exceed the vision "
                f"encoder's {self.max_side}-patch grid"
            )
        ids = grid_ids(h, w, self.max_side)
        vit = self.vit_model.vision_model
        x = vit.embeddings.patch_embedding(patchify(pixels.to(self.dtype), self.patch))
        x = x + vit.embeddings.position_embedding(ids)
        for layer in vit.encoder.layers:
            x = layer(x)
        x = self.connector(vit.post_layernorm(x))
        return x + self.vit_pos_embed(ids)
