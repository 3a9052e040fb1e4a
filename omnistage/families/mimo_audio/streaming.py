"""MiMo-Audio's low-latency code2wav: the tokenizer's `streaming_decode`, chunk by chunk.

The reference (`MiMoAudioTokenizer.streaming_decode` in `mimo_audio_tokenizer/
modeling_audio_tokenizer.py`, its default `StreamingConfig`: `left_overlap` 250 codes,
`right_overlap` 40; `seg_point` is not read there) decodes each new chunk of codes as one
window: the codes it kept from before (at most the last 250 it has seen), then the chunk,
decoded as a sequence of its own (RoPE from 0, GroupNorm over the window). Of the window's
audio it returns the samples from where the previous return ended up to 40 codes before
the window's end (those codes are returned by a later window, which sees the codes after
them); a window of at most 40 codes returns nothing; the last chunk returns up to the end.
There is no crossfade: the returned pieces are cut at code boundaries and concatenated.

Counted in codes, with `before` codes seen before a chunk of `new` (by induction on the
reference's cache, which always holds the last `min(250, seen)` codes):

    window   codes [before - min(before, 250), before + new)
    returns  window codes [max(0, min(before, 250) - 40), window end - 40 (or the end))

so a chunk's audio is a function of its own codes, the 250 before them and whether it
is the last: `window_bounds`. The stage is stateless; the edge's `left_context` gives
each chunk the LM steps before it (the deploy gives all of them), and `check_item`
refuses a chunk whose context holds fewer than 250 codes without reaching the request's
start. A code's samples are `avg_pooler * stride_size * hop_length`, as the reference
counts them (with the encoder's `stride_size`; the real checkpoint's decoder stride is the
same). The step filter (`edges.audio_frames`) runs per row, so each chunk's codes are those
the whole payload's filter gives it; chunk boundaries are the edge's, counted in LM steps.

The first audio of a stream comes with the first chunk that brings more than 40 codes
(the `mimo-audio-stream` deploy's first chunk of 16 steps is up to 64 codes), instead of
after 375 steps: the whole-segment decode (`code2wav.py`, the reference's `MimoAudio`
path) stays the default deploy's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from omnistage.families.mimo_audio.code2wav import MiMoAudioCode2Wav
from omnistage.families.mimo_audio.config import AudioDecoderConfig
from omnistage.models.generation import GenerationItem

LEFT_OVERLAP = 250
"""Codes before a chunk its window decodes (the reference's `left_overlap`, 10 s)."""
RIGHT_OVERLAP = 40
"""Codes at a window's end whose audio waits for the next window (`right_overlap`)."""


def window_bounds(
    before: int, new: int, last: bool, left: int = LEFT_OVERLAP, right: int = RIGHT_OVERLAP
) -> tuple[int, int, int]:
    """For a chunk of `new` codes after `before` codes: (codes of context in its window,
    first and end code of the window whose audio it returns; first == end: none)."""
    context = min(before, left)
    length = context + new
    start = max(0, context - right)
    end = length if last else length - right
    return context, start, max(start, end)


class MiMoAudioStreamingCode2Wav(MiMoAudioCode2Wav):
    """code2wav as the reference's `streaming_decode` (see the module docstring); the
    `code2wav_stream` part of MiMo-Audio checkpoints."""

    left_overlap: ClassVar[int] = LEFT_OVERLAP
    right_overlap: ClassVar[int] = RIGHT_OVERLAP

    def __init__(self, config: AudioDecoderConfig, lm_config: Any, dtype: torch.dtype) -> None:
        super().__init__(config, lm_config, dtype)
        self.stream_samples_per_code = config.avg_pooler * config.stride_size * config.hop_length

    def _split(self, item: GenerationItem) -> tuple[torch.Tensor, torch.Tensor]:
        """The frames of the item's context rows and of its own rows."""
        start = item.offset + item.context_len
        before = self.frames(item.rows[: item.context_len], item.offset)
        return before, self.frames(item.rows[item.context_len : item.own_end], start)

    def check_item(self, item: GenerationItem) -> None:
        before, own = self._split(item)
        if item.offset > 0 and before.shape[0] < self.left_overlap:
            start = item.offset + item.context_len
            raise ValueError(
                f"codes.audio: the chunk at step {start} has {before.shape[0]} codes of left "
                f"context, fewer than the {self.left_overlap} its streaming window needs, and "
                "its context does not reach the request's first step (raise the edge's "
                "left_context)"
            )

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        for item in items:
            before, own = self._split(item)
            context, start, end = window_bounds(
                before.shape[0], own.shape[0], item.last, self.left_overlap, self.right_overlap
            )
            if end == start:
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            window = torch.cat([before[before.shape[0] - context :], own])
            wav = self.decode(window)
            step = self.stream_samples_per_code
            outputs.append(wav[start * step :] if item.last else wav[start * step : end * step])
        return outputs
