"""`VAEStream` and `decode_chunk`: the Ming-flash-omni audio VAE decoder over a stream's
chunks, each latent frame decoded once.

The decoder (`audio_vae.AudioVAEDecoder`: fc1, a linear upsampler, a causal Qwen2, an
ISTFT head) looks back through the Qwen2 only; the upsampler reads one latent frame
before and after, the ISTFT two upsampled frames before and after a frame's samples. So a
chunk (its own latent frames and the next patch, the edge's right context) decodes after
what the stream kept of the frames before it: the last latent frame (for the upsampler),
the Qwen2's keys and values of every committed upsampled frame (a transformers
`DynamicCache`) and the last two hidden frames (for the ISTFT's overlap). The next
patch's frames are run too, for the look-ahead, then dropped from the cache: they are
committed with the chunk that owns them. Each chunk's samples equal the whole decode's
up to float rounding (the reference's streamed decode keeps the same: a KV cache, a
one-frame look-ahead upsampler and overlap buffers); the cost of a chunk is its own frames
and the attention over the ones before, not a decode of the whole prefix again.

A decode never advances a stream in place: `decode_chunk` returns the next `VAEStream`
(the cache is cut back to the committed frames on its next use, so a failed call leaves
nothing behind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

HEAD_OVERLAP = 2
"""Upsampled frames before and after a frame whose ISTFT windows reach into its samples
(an `n_fft` of four hops)."""


@dataclass(frozen=True)
class VAEStream:
    """What a stream's next chunk needs of the frames decoded before it."""

    cache: Any = None
    """The Qwen2's `DynamicCache` (may hold more than `committed` frames after a failed or
    look-ahead run: cut back before use)."""
    committed: int = 0
    """Upsampled frames decoded and spoken: the position of the next one."""
    last_latent: torch.Tensor | None = None
    """[1, 1, C]: the last committed latent frame (the upsampler's left neighbour)."""
    hidden_tail: torch.Tensor | None = None
    """[1, <= HEAD_OVERLAP, dim]: the Qwen2's last committed hidden frames."""


def decode_chunk(
    decoder: Any, stream: VAEStream, latents: torch.Tensor, skip: int, own: int, last: bool
) -> tuple[torch.Tensor, VAEStream]:
    """The samples of latent frames `latents[:, skip : skip + own]` ([1, F, C]: the frames
    after the stream's, `skip` of them decoded but not spoken (a first chunk's left
    context), then `own`, then the next patch's as look-ahead; none after the `last`
    chunk) and the stream after them."""
    from transformers import DynamicCache

    p = decoder.patch_size
    window = latents if stream.last_latent is None else torch.cat([stream.last_latent, latents], 1)
    x = decoder.fc1(window).transpose(1, 2)
    x = F.interpolate(x, scale_factor=p, mode="linear", align_corners=False).transpose(1, 2)
    if stream.last_latent is not None:
        x = x[:, p:]  # the kept frame's own upsampled frames went out before
    cache = stream.cache if stream.cache is not None else DynamicCache()
    extra = cache.get_seq_length() - stream.committed
    if extra > 0:  # look-ahead frames of the last chunk, or a failed call's
        cache.crop(-extra)
    hidden = decoder.decoder(inputs_embeds=x, past_key_values=cache, use_cache=True)
    hidden = hidden.last_hidden_state
    keep = (skip + own) * p
    tail = stream.hidden_tail
    frames = hidden if tail is None else torch.cat([tail, hidden], 1)
    first = stream.committed - (0 if tail is None else tail.shape[1])
    start, stop = stream.committed + skip * p, stream.committed + keep
    if not last:  # hidden frames past the look-ahead's first ones are not needed
        frames = frames[:, : stop + HEAD_OVERLAP - first]
    wav = decoder.head.samples(frames, first, start, stop)
    committed = frames[:, : stop - first]
    return wav, VAEStream(
        cache=cache,
        committed=stop,
        last_latent=latents[:, skip + own - 1 : skip + own],
        hidden_tail=committed[:, max(0, committed.shape[1] - HEAD_OVERLAP) :],
    )
