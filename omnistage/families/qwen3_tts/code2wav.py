"""Qwen3-TTS's speech-tokenizer decoder ("code2wav") as a generation-stage model.

Input rows are code frames `[T, num_quantizers]` (column 0 the talker's code, the rest
the code predictor's); output is the waveform at the tokenizer's `output_sample_rate`
(24 kHz), `upsample` samples per frame. The talker's end frame (its first code is
`codec_eos`) and every frame after it are not speech: the decode is cut there, as the
reference's `generate` stops there. Every code before it is checked against its
codebook: one outside it (a `-1` placeholder, a control code in a speech frame) is a
ValueError naming the frame and codebook, never decoded (`check_item` makes it fail its
own request in the stage).

The decoder (`codec_decoder.Qwen3TTSCodecDecoder`) is causal and `n` frames decode to
exactly `n * upsample` samples (no trim). A stream's chunks (items with a `state`)
decode through a `DecoderStream` kept in that state: the first chunk with its left
context (the producer's context codes), the later ones their own frames only, after
what the stream kept of the frames before (each convolution's last inputs, each
attention layer's keys and values). So the streamed chunks concatenate to the whole
decode up to float rounding, however they are cut, and a chunk costs its own frames
only: the edge's `left_context` rows are not decoded again (vLLM-Omni decodes 72
frames of context for every 25-frame chunk of this model). Streams are advanced only
when a whole `generate` call went well (a failed batch is retried item by item), and a
request's chunks decode in order, also two of them in one call. An item without a
state (a whole payload from a stage's submit) decodes its context rows and drops
their samples, as the reference's `chunked_decode` does with its 25 frames of context.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omnistage.families.qwen3_tts.codec_decoder import CodecDecoderConfig, Qwen3TTSCodecDecoder
from omnistage.families.qwen3_tts.codec_stream import DecoderStream
from omnistage.models.code_frames import CodeFrameVocoder
from omnistage.models.generation import GenerationItem, load_part_module
from omnistage.models.stream_states import StreamStates

FOLDER = "speech_tokenizer"
PREFIX = "decoder."
WEIGHTS = "model.safetensors"
STREAM_KEY = "decoder_stream"
"""Where a stream's `DecoderStream` lives in `GenerationItem.state`."""


def read_speech_tokenizer_config(path: Path) -> dict[str, Any]:
    """`path/speech_tokenizer/config.json` (ValueError naming the file when missing or bad)."""
    config_file = Path(path) / FOLDER / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model: {config_file} is missing (the Qwen3-TTS speech tokenizer)")
    try:
        config = json.loads(config_file.read_text())
    except ValueError as e:
        raise ValueError(f"{config_file}: not valid JSON ({e})") from e
    if not isinstance(config, dict) or not isinstance(config.get("decoder_config", {}), dict):
        raise ValueError(f"{config_file}: decoder_config must be an object")
    return config


class Qwen3TTSCode2Wav(CodeFrameVocoder):
    architectures = ()  # a part (`speech_tokenizer/`) of Qwen3-TTS checkpoints
    output_modality = "audio"

    def __init__(
        self,
        config: CodecDecoderConfig,
        dtype: torch.dtype,
        sample_rate: int,
        codec_eos_token_id: int | None = None,
    ) -> None:
        super().__init__()
        self.module = Qwen3TTSCodecDecoder(config).to(dtype).eval()
        self.dtype = dtype
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.upsample = config.total_upsample
        self.sample_rate = sample_rate
        self.codec_eos_token_id = codec_eos_token_id
        """The talker's end code (None: the first frame whose first code is past the
        codebook ends the speech)."""

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> Qwen3TTSCode2Wav:
        """The decoder of `path/speech_tokenizer/`; `hf_config` (the checkpoint's, or None)
        gives the talker's `codec_eos_token_id`."""
        raw = read_speech_tokenizer_config(path)
        folder = Path(path) / FOLDER
        config_file = folder / "config.json"
        try:
            config = CodecDecoderConfig.from_dict(raw.get("decoder_config", {}))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{config_file}: {e}") from e
        rate = raw.get("decode_upsample_rate", config.total_upsample)
        if rate != config.total_upsample:
            raise ValueError(
                f"{config_file}: decode_upsample_rate {rate} is not the decoder's "
                f"{config.total_upsample} samples per frame"
            )
        if not (folder / WEIGHTS).is_file() and not (folder / f"{WEIGHTS}.index.json").is_file():
            raise ValueError(
                f"model: {folder / WEIGHTS} is missing (the speech tokenizer's weights)"
            )
        talker = getattr(hf_config, "talker_config", None)
        eos = getattr(talker, "codec_eos_token_id", None)
        model = cls(config, dtype, int(raw.get("output_sample_rate", 24000)), eos)
        load_part_module(model.module, folder, PREFIX, f"{WEIGHTS}: decoder")
        return model

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        streams = StreamStates(STREAM_KEY)
        for item in items:
            if item.rows[: item.own_end].numel() == 0 or self.after_speech(item):
                outputs.append(torch.zeros(0, dtype=torch.float32))  # nothing (more) to speak
                continue
            frames = self.speech_frames(item)
            context = item.context_len
            if frames.shape[0] <= context:  # the end frame is in the context or comes first
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            state, kept = item.state, streams.kept(item)
            if kept is None:  # whole, or a stream's first chunk: context rows decoded too
                stream = None if state is None or item.last else DecoderStream()
                wav = self._decode(frames, stream)[context * self.upsample :]
            else:  # a later chunk: its own rows after what the stream kept
                stream = kept.advanced()
                wav = self._decode(frames[context:], stream)
            if stream is not None:
                streams.advance(item, stream)
            outputs.append(wav.float())
        streams.commit()
        return outputs

    def _decode(self, frames: torch.Tensor, stream: DecoderStream | None) -> torch.Tensor:
        device = next(self.module.parameters()).device
        return self.module(frames.T.unsqueeze(0).long().to(device), stream)[0, 0]
