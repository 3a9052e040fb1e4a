"""Audio input for MiMo-Audio's fused LM: its multimodal processor.

A rendered prompt holds one `<|sosp|><|empty|><|eosp|>` per clip (the chat template
renders an audio content part so). As the reference lays an audio `InputSegment` out
(`mimo_audio/process_speechdata.py` `to_input_id`, with the codes of `MimoAudio.
preprocess_input`): the clip, resampled to the tokenizer's rate, goes through the
tokenizer's encoder (`audio_encoder.py`); its first `audio_channels` codebooks, the last
frame repeated to a whole group, make one position per `group_size` frames, whose text
is `<|empty|>` (so the `<|empty|>` slot is repeated to that count). Those positions'
input rows are the LM's patch encoder of their codes (`model.patch_encode`, the text
part zero for `<|empty|>`); every other position's is its `embed_tokens` row.

Loads the tokenizer's encoder, the LM's `embed_tokens` and its input-side audio tensors
(`speech_embeddings`, `input_local_transformer`, `speech_group_downcast`) only.
Positions are plain `0..L-1`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnistage.families.mimo_audio.audio_encoder import load_audio_encoder, wav2mel
from omnistage.families.mimo_audio.config import (
    MODEL_TYPE,
    input_local_config,
    speech_empty_ids,
    speech_vocab_sizes,
)
from omnistage.families.mimo_audio.local_transformer import LocalTransformer
from omnistage.families.mimo_audio.model import patch_encode
from omnistage.multimodal.modalities import MediaTokens
from omnistage.multimodal.prompts import EncodedPrompt

INPUT_PARTS = ("speech_embeddings.", "input_local_transformer.", "speech_group_downcast.")
EMBED = "model.embed_tokens.weight"


class _AudioTokens(MediaTokens):
    """MiMo-Audio's audio span; it has none for images."""

    def placeholders(self) -> dict[str, str]:
        return {"audio": self.placeholder("audio")}


def position_codes(codes: torch.Tensor, channels: int, group: int) -> torch.Tensor:
    """[frames, n_q] encoder codes -> [positions, group * channels] (frame-major), the
    last frame repeated to a whole group (`preprocess_input`)."""
    codes = codes[:, :channels]
    short = -codes.shape[0] % group
    codes = torch.cat([codes, codes[-1:].expand(short, -1)])
    return codes.reshape(-1, group * channels)


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if key == EMBED or key.startswith(INPUT_PARTS):
                    out[key] = f.get_tensor(key)
    return out


class InputParts(nn.Module):
    """The LM's input-side audio modules (`model.AudioParts` without the local
    transformer and its heads), by the checkpoint's names."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        inner = input_local_config(config)
        sizes = speech_vocab_sizes(config)
        self.input_local_transformer = LocalTransformer(inner)
        self.speech_embeddings = nn.ModuleList(nn.Embedding(n, inner.hidden_size) for n in sizes)
        width = inner.hidden_size * config.group_size
        self.speech_group_downcast = nn.Linear(width, config.hidden_size, bias=False)


class MiMoAudioInputEncoder:
    model_type = MODEL_TYPE
    model_name = "MiMo-Audio"
    tokens = _AudioTokens(audio=("<|sosp|>", "<|empty|>", "<|eosp|>"), image=("", "", ""))

    def __init__(self, config: Any, tokenizer: Any, path: Path, dtype: torch.dtype) -> None:
        self.config, self.tokenizer = config, tokenizer
        self.encoder = load_audio_encoder(path / "audio_tokenizer")
        weights = _load_weights(path)
        if EMBED not in weights:
            raise ValueError(f"model: {path} has no {EMBED}")
        self.embed = weights.pop(EMBED).to(dtype)
        self.parts = InputParts(config)
        missing = [k for k in self.parts.state_dict() if k not in weights]
        if missing:
            raise ValueError(f"model: {path} has no {missing[0]}")
        self.parts.load_state_dict(weights, strict=True)
        self.parts.to(dtype).eval()
        self.group, self.channels = int(config.group_size), int(config.audio_channels)
        self.empty_codes = torch.tensor(speech_empty_ids(config) * self.group)
        self.marker_ids = [tokenizer.convert_tokens_to_ids(t) for t in self.tokens.audio]
        self.dtype = dtype

    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        return frozenset({"audio"} if getattr(config, "model_type", None) == cls.model_type else ())

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> MiMoAudioInputEncoder:
        from omnistage.models.registry import auto_config_and_tokenizer

        config, tokenizer = auto_config_and_tokenizer(Path(path), "MiMo-Audio")
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        return cls(config, tokenizer, Path(path), dtype)

    def clip_codes(self, wave: Any, rate: int) -> torch.Tensor:
        """[positions, group * channels] codes of one mono clip at `rate` Hz."""
        from omnistage.multimodal.media import resample_audio

        target = self.encoder.config.sampling_rate
        wave = resample_audio(np.asarray(wave, dtype=np.float32).reshape(-1), rate, target)
        if wave.size < self.encoder.config.nfft // 2 + 1:
            raise ValueError(f"audio: the clip is too short ({wave.size} samples at {target} Hz)")
        mel = wav2mel(torch.from_numpy(np.ascontiguousarray(wave)), self.encoder.config)
        return position_codes(self.encoder.encode(mel), self.channels, self.group)

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        return [int(t) for t in prompt]

    @torch.no_grad()
    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> EncodedPrompt:
        """Expand each audio span of `prompt` for its clip (`(samples, rate)` pairs, in
        order) and build the prompt's input rows."""
        if images:
            raise ValueError("image: MiMo-Audio takes audio and text only")
        start, pad, end = self.marker_ids
        ids = self._ids(prompt)
        slots = [i for i in range(1, len(ids) - 1) if ids[i - 1 : i + 2] == [start, pad, end]]
        if len(slots) != len(audios):
            raise ValueError(
                f"prompt: {len(slots)} audio placeholder(s) "
                f"{self.tokens.placeholder('audio')!r} but {len(audios)} audio input(s)"
            )
        codes = [self.clip_codes(*(a if isinstance(a, tuple) else (a, 16000))) for a in audios]
        counts = dict(zip(slots, (c.shape[0] for c in codes), strict=True))
        expanded = [t for i, tok in enumerate(ids) for t in [tok] * counts.get(i, 1)]
        ids_t = torch.tensor(expanded, dtype=torch.long)
        if int(ids_t.max()) >= self.embed.shape[0] or int(ids_t.min()) < 0:
            raise ValueError("prompt: token id outside the vocabulary")
        embeds = self.embed[ids_t].clone()
        mask = torch.tensor(
            [i in counts for i, _ in enumerate(ids) for _ in range(counts.get(i, 1))]
        )
        embeds[ids_t == pad] = 0.0  # `<|empty|>` embeds as zero (as the LM's embed_input_ids)
        if codes:
            full = bool(self.config.input_full_attention)
            speech = patch_encode(self.parts, torch.cat(codes), self.empty_codes, self.group, full)
            embeds[mask] += speech.to(embeds.dtype)
        return EncodedPrompt.audio_only(expanded, embeds, mask, [c.shape[0] for c in codes])
