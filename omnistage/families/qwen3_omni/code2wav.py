"""Qwen3-Omni's code2wav as a generation-stage model (wrapping transformers' module).

Input rows are code frames `[T, num_quantizers]` (row 0 of each frame is the
talker's code, the rest the code predictor's); output is the waveform, 24 kHz,
`total_upsample` samples per frame. One decode of `n` frames gives
`total_upsample * n - trim` samples (the causal transposed convolutions cut
`trim` samples off the end), and the decoder is causal, so a chunk decoded with
enough left context reproduces the whole decode's samples from
`start * total_upsample - trim`: each chunk here returns exactly those, and the
streamed chunks concatenate to the whole decode (the reference `chunked_decode`
drops the last `trim` samples of every chunk instead). The values at a seam
match the whole decode as closely as the left context lets them: what a frame
hears fades with distance (the attention window — 72 frames in the real model —
then the convolutions); on the tiny test model 24 frames of context leave ~1e-3,
32 frames ~4e-7. That is for items without a stream state; a stream's chunks (items
with a `state`) decode through a `Code2WavStream` (`code2wav_stream.py`): each frame
once, after what the stream kept of the ones before, each chunk giving the samples its
frames complete (the same count as above), equal to the whole decode's up to float
rounding however the chunks are cut; the edge's left context is then not decoded
again (vLLM-Omni decodes 25 frames of it with every chunk).

The talker's last frame is its end frame (first code `codec_eos`, past the
codebook): like transformers' `generate`, which cuts each sequence at its first
`codec_eos`, the decode stops before the first end frame in what an item sees
(its left context and own rows), so nothing from the end frame on reaches the
vocoder. Every code of every frame before it is checked against its codebook
(`speech_frames`): the vocoder embeds all codebooks in one table, where a code
out of range would silently read a neighbouring codebook's row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.families.qwen3_omni.code2wav_stream import (
    Code2WavStream,
    decode_chunk,
    streamable,
)
from omnistage.models.code_frames import CodeFrameVocoder
from omnistage.models.generation import GenerationItem, load_part_module
from omnistage.models.stream_states import StreamStates

PREFIX = "code2wav."
STREAM_KEY = "code2wav_stream"
"""Where a stream's `Code2WavStream` lives in `GenerationItem.state`."""
SAMPLE_RATE = 24000  # of the released model; not stored in its config


class Qwen3OmniCode2Wav(CodeFrameVocoder):
    architectures = ()  # a part of Qwen3OmniMoeForConditionalGeneration checkpoints
    output_modality = "audio"

    def __init__(self, config: Any, dtype: torch.dtype, codec_eos_token_id: int) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeCode2Wav,
        )

        self.module = Qwen3OmniMoeCode2Wav(config).to(dtype).eval()
        self.dtype = dtype
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.codec_eos_token_id = codec_eos_token_id
        self.upsample = int(self.module.total_upsample)
        self.trim = self.upsample - self._decoded_length(1)
        self.sample_rate = SAMPLE_RATE
        self.streams = streamable(self.module)
        """Whether a stream's chunks decode through a `Code2WavStream` (each frame once)."""

    def _decoded_length(self, frames: int) -> int:
        codes = torch.zeros(1, self.num_quantizers, frames, dtype=torch.long)
        with torch.inference_mode():
            return int(self.module(codes).shape[-1])

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> Qwen3OmniCode2Wav:
        eos = hf_config.talker_config.codec_eos_token_id
        model = cls(hf_config.code2wav_config, dtype, eos)
        load_part_module(model.module, path, PREFIX, "code2wav")
        return model

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        streams = StreamStates(STREAM_KEY)
        for item in items:
            context = item.context_len
            if item.rows[: item.own_end].numel() == 0 or self.after_speech(item):
                outputs.append(torch.zeros(0, dtype=torch.float32))  # nothing (more) to speak
                continue
            frames = self.speech_frames(item)
            if frames.shape[0] <= context:  # the end frame is in the context or comes first
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            state, kept = item.state, streams.kept(item) if self.streams else None
            if kept is None and (state is None or item.last or not self.streams):
                wav = self.module(frames.T.unsqueeze(0).long())[0, 0]
            elif kept is None:  # a stream's first chunk: its context rows decoded too
                wav, after = decode_chunk(self.module, Code2WavStream(), frames.T[None].long())
                streams.advance(item, after)
                wav = wav[0, 0]
            else:  # the samples its own frames complete, after the stream's
                codes = frames[context:].T[None].long()
                wav, after = decode_chunk(self.module, kept, codes)
                streams.advance(item, after)
                outputs.append(wav[0, 0].float())
                continue
            # Samples from (start * upsample - trim): the seam the previous chunk could not
            # produce yet, then this chunk's own samples (all but the trim at its end).
            first = context * self.upsample - (self.trim if context else 0)
            outputs.append(wav[first:].float())
        streams.commit()
        return outputs
