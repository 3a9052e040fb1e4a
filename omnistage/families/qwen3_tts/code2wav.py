"""Qwen3-TTS's speech-tokenizer decoder ("code2wav") as a generation-stage model.

Input rows are code frames `[T, num_quantizers]` (column 0 the talker's code, the rest
the code predictor's); output is the waveform at the tokenizer's `output_sample_rate`
(24 kHz), `upsample` samples per frame. Frames whose first code is past the codebook
(the talker's end frame, control codes) are not speech and are dropped; a negative code
(an unfilled placeholder) is an error, never decoded.

The decoder (`codec_decoder.Qwen3TTSCodecDecoder`) is causal and `n` frames decode to
exactly `n * upsample` samples (no trim), so a chunk decoded after `context_len` frames
of left context returns its samples from `context * upsample` on, and the streamed
chunks concatenate to the whole decode. Values at a seam match the whole decode as
closely as the left context lets them: what a frame hears fades with distance (the
attention window, `sliding_window` frames per layer — 8 layers of 72 in the real model
— then the convolutions); the reference's own `chunked_decode` uses 25 frames.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from omnistage.families.qwen3_tts.codec_decoder import CodecDecoderConfig, Qwen3TTSCodecDecoder
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module

FOLDER = "speech_tokenizer"
PREFIX = "decoder."
WEIGHTS = "model.safetensors"


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


class Qwen3TTSCode2Wav(GenerationModel):
    architectures = ()  # a part (`speech_tokenizer/`) of Qwen3-TTS checkpoints
    output_modality = "audio"

    def __init__(self, config: CodecDecoderConfig, dtype: torch.dtype, sample_rate: int) -> None:
        super().__init__()
        self.module = Qwen3TTSCodecDecoder(config).to(dtype).eval()
        self.dtype = dtype
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.upsample = config.total_upsample
        self.sample_rate = sample_rate

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> Qwen3TTSCode2Wav:
        """The decoder of `path/speech_tokenizer/` (`hf_config`, the talker's, is not read)."""
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
        model = cls(config, dtype, int(raw.get("output_sample_rate", 24000)))
        load_part_module(model.module, folder, PREFIX, f"{WEIGHTS}: decoder")
        return model

    def _speech_frames(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Check a chunk's code frames; return the speech frames and which rows they are."""
        if frames.ndim != 2 or frames.shape[1] != self.num_quantizers:
            raise ValueError(
                f"codes.audio: expected [frames, {self.num_quantizers}] codes, "
                f"got {list(frames.shape)}"
            )
        if bool((frames < 0).any()):
            raise ValueError(f"codes.audio: negative code {int(frames.min())} (a placeholder?)")
        # The talker's end frame (its first code is `codec_eos`, past the codebook) is not speech.
        speech = frames[:, 0] < self.codebook_size
        kept = frames[speech]
        if bool((kept >= self.codebook_size).any()):
            raise ValueError(
                f"codes.audio: code {int(kept.max())} past the codebook ({self.codebook_size}) "
                "in a speech frame"
            )
        return kept, speech

    @torch.inference_mode()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        outputs = []
        for item in items:
            # Causal: frames after the chunk's own (right context) change nothing.
            rows = item.rows[: item.own_end]
            if rows.numel() == 0:  # e.g. the empty last chunk of a stream
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            frames, speech = self._speech_frames(rows)
            context = int(speech[: item.context_len].sum())
            if frames.shape[0] == context:  # only end / control frames of its own
                outputs.append(torch.zeros(0, dtype=torch.float32))
                continue
            device = next(self.module.parameters()).device
            wav = self.module(frames.T.unsqueeze(0).long().to(device))[0, 0]
            outputs.append(wav[context * self.upsample :].float())
        return outputs
