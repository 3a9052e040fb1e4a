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
        self._stacked: tuple | None = None
        """(the codebooks' entries it was made from, the stacked table, starts, bins)."""

    def _entries(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Every codebook's entries as one table `[K * bins, dim]`, each codebook's first
        row in it and the smallest codebook's size; remade when a codebook's entries are
        (`refresh` sets new tensors)."""
        tables = [layer._codebook.embedding for layer in self.vq.layers]
        kept = self._stacked
        if kept is None or any(a is not b for a, b in zip(kept[0], tables, strict=True)):
            starts = torch.tensor([0, *(t.shape[0] for t in tables[:-1])]).cumsum(0)
            stacked = (torch.cat(tables), starts.to(tables[0].device))
            kept = self._stacked = (tables, *stacked, min(t.shape[0] for t in tables))
        return kept[1], kept[2], kept[3]

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """`[B, K, T]` codes -> `[B, io_dim, T]`: each codebook's entries, summed in codebook
        order (found in one lookup over the stacked codebooks without autograd)."""
        table, starts, bins = self._entries()
        if torch.is_grad_enabled() or int(codes.min()) < 0 or int(codes.max()) >= bins:
            # One lookup per codebook: autograd, or a code outside its codebook (an error
            # there, never a row of the next codebook).
            quantized = sum(layer.decode(codes[:, k]) for k, layer in enumerate(self.vq.layers))
            return self.output_proj(quantized)
        entries = F.embedding(codes + starts[None, :, None], table)  # [B, K, T, dim]
        quantized = sum(entries[:, k].transpose(1, 2) for k in range(entries.shape[1]))
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
