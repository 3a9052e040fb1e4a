"""A stream's `GenerationItem`s as the generation stage cuts them, for the streamed
vocoders' tests (Qwen3-TTS and Qwen3-Omni code2wav, Ming-flash-omni's audio VAE)."""

from __future__ import annotations

import torch

from omnistage.models.generation import GenerationItem


def stream_items(
    rows: torch.Tensor,
    chunks: list[int],
    *,
    prefix: int = 0,
    left_context: int = 0,
    lookahead: int = 0,
) -> list[GenerationItem]:
    """`rows` cut into chunks of `chunks` own rows after `prefix` rows of the producer's
    context: the first chunk starts with that prefix, each later one with up to
    `left_context` rows before it, each but the last with `lookahead` rows after it; the
    rows numbered as the stage numbers them; one state dict for the whole stream."""
    state: dict = {}
    items, start = [], prefix
    for n, size in enumerate(chunks):
        last = n == len(chunks) - 1
        context = prefix if n == 0 else min(start, left_context)
        ahead = 0 if last else lookahead
        items.append(
            GenerationItem(
                rows[start - context : start + size + ahead].clone(),
                context_len=context,
                lookahead_len=ahead,
                offset=start - context,
                state=state,
                last=last,
            )
        )
        start += size
    return items
