"""The Qwen3-TTS 12 Hz speech tokenizer's split residual vector quantizer, decode side.

Codes `[B, num_quantizers, T]` -> latents `[B, codebook_dim, T]`: one semantic codebook
(`rvq_first`) and `num_quantizers - 1` acoustic ones (`rvq_rest`), each of width
`codebook_dim / 2`, looked up, summed per quantizer and projected back to `codebook_dim`.
Module and parameter names are the reference's (`qwen-tts`, `SplitResidualVectorQuantizer`)
so the checkpoint's `decoder.quantizer.*` tensors load as they are. This module owns the
codebooks and their lookup.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class EuclideanCodebook(nn.Module):
    """Codebook entries stored as `embedding_sum / cluster_usage` (EMA statistics); the
    quotient is computed once, after the weights load, into `embedding`."""

    def __init__(self, dim: int, codebook_size: int, epsilon: float = 1e-5) -> None:
        super().__init__()
        self.epsilon = epsilon
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))
        self.register_buffer("embedding", torch.zeros(codebook_size, dim), persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh())

    @torch.no_grad()
    def refresh(self) -> None:
        usage = self.cluster_usage.clamp(min=self.epsilon)[:, None]
        self.embedding = self.embedding_sum / usage


class VectorQuantization(nn.Module):
    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """`[B, T]` codes -> `[B, dim, T]`."""
        return F.embedding(codes, self._codebook.embedding).transpose(1, 2)


class ResidualVectorQuantization(nn.Module):
    def __init__(self, num_quantizers: int, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [VectorQuantization(dim, codebook_size) for _ in range(num_quantizers)]
        )


class ResidualVectorQuantizer(nn.Module):
    """Codebooks of width `dimension`, summed, then projected back to `io_dim` (the
    `input_proj` is the encoder side's, loaded but not used to decode)."""

    def __init__(self, num_quantizers: int, dimension: int, io_dim: int, bins: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dimension, 1, bias=False)
        self.output_proj = nn.Conv1d(dimension, io_dim, 1, bias=False)
        self.vq = ResidualVectorQuantization(num_quantizers, dimension, bins)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """`[B, K, T]` codes -> `[B, io_dim, T]`."""
        quantized = sum(layer.decode(codes[:, k]) for k, layer in enumerate(self.vq.layers))
        return self.output_proj(quantized)


class SplitResidualVectorQuantizer(nn.Module):
    """The first (semantic) codebook and the rest (acoustic) as two quantizers, summed."""

    def __init__(self, num_quantizers: int, codebook_dim: int, codebook_size: int) -> None:
        super().__init__()
        dim, n_q = codebook_dim, num_quantizers
        self.rvq_first = ResidualVectorQuantizer(1, dim // 2, dim, codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(n_q - 1, dim // 2, dim, codebook_size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])
