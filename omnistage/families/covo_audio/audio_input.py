"""Audio input for Covo-Audio's fused LM: its multimodal processor and audio encoder.

A rendered prompt holds one `<|begofcAUDIO|><|cAUDIO|><|endofcAUDIO|>` per clip; each
`<|cAUDIO|>` is repeated to its clip's token count, and those positions' input rows are
the clip's features, the rest the LM's `embed_tokens` rows (`CovoAudioForCausalLM.
prepare_inputs_for_generation`'s `masked_scatter`). As the reference's `get_dialog_prompt`
and `audio_encoder` prepare a clip (`covoaudio/modeling_covo_audio.py`), at 16 kHz:

- trimmed to whole 10 ms hops, zero-padded to a multiple of 20 ms; its token count is
  the number of 10 ms hops halved (rounding up) four times (`calc_seq_len`: the Whisper
  encoder's stride 2, then the adapter's three);
- cut into 30 s segments, each zero-padded to 30 s, as 128-bin log-mel spectrograms
  (openai-whisper's `log_mel_spectrogram`, slaney mel filters), through the Whisper
  encoder (`encoder.*`, transformers' `WhisperEncoder`) and `audio_adapter.*` (three
  stride-2 convolution + MLP layers to the LM's width); the segments' rows follow each
  other and the clip takes its first `count` of them.

The reference takes its audio at any rate and resamples it to 24 kHz and back to 16 kHz
for the encoder (torchaudio); here clips arrive at 16 kHz and go to the encoder as they
are. Positions are plain `0..L-1`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.multimodal.modalities import MediaTokens
from omnistage.multimodal.prompts import EncodedPrompt

RATE = 16000
SEGMENT = 30 * RATE
_N_FFT, _HOP = 400, 160


def audio_token_count(num_samples: int) -> int:
    """Tokens of a clip of `num_samples` 16 kHz samples (after trimming and padding)."""
    hops = num_samples // _HOP
    count = hops + hops % 2  # padded to 20 ms
    for _ in range(4):
        count = (count + 1) // 2
    return count


class DownsampleLayer(nn.Module):
    def __init__(self, width: int, out: int, hidden: int = 2048) -> None:
        super().__init__()
        self.conv1d = nn.Conv1d(width, width, kernel_size=3, stride=2, padding=1)
        self.linear1 = nn.Linear(width, hidden)
        self.linear2 = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1d(x.transpose(1, 2)).transpose(1, 2)
        return self.linear2(torch.relu(self.linear1(torch.relu(x))))


class AudioAdapter(nn.Module):
    def __init__(self, width: int, out: int, downsample: int) -> None:
        super().__init__()
        n = downsample.bit_length() - 1
        self.downsample_layers = nn.ModuleList(
            DownsampleLayer(width, out if i == n - 1 else width) for i in range(n)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.downsample_layers:
            x = layer(x)
        return x


def log_mel(wave: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """openai-whisper's log-mel spectrogram `[mels, frames]` of a 16 kHz `wave`."""
    window = torch.hann_window(_N_FFT, dtype=wave.dtype)
    stft = torch.stft(wave, _N_FFT, _HOP, window=window, return_complex=True)
    mel = filters.to(wave.dtype) @ (stft[..., :-1].abs() ** 2)
    log = torch.clamp(mel, min=1e-10).log10()
    return (torch.maximum(log, log.max() - 8.0) + 4.0) / 4.0


def slaney_filters(mels: int) -> torch.Tensor:
    """`[mels, 201]` slaney mel filters for 16 kHz, n_fft 400 (librosa's default)."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=_N_FFT // 2 + 1, num_mel_filters=mels, min_frequency=0.0,
        max_frequency=RATE / 2, sampling_rate=RATE, norm="slaney", mel_scale="slaney",
    )  # fmt: skip
    return torch.from_numpy(bank.T.astype(np.float32))


class _AudioTokens(MediaTokens):
    """Covo-Audio's audio placeholder; it has none for images (no image input)."""

    def placeholders(self) -> dict[str, str]:
        return {"audio": self.placeholder("audio")}


class CovoAudioInputEncoder:
    model_type = "covo_audio"
    model_name = "Covo-Audio"
    tokens = _AudioTokens(
        audio=("<|begofcAUDIO|>", "<|cAUDIO|>", "<|endofcAUDIO|>"), image=("", "", "")
    )

    def __init__(self, config: Any, tokenizer: Any, weights: dict[str, torch.Tensor]) -> None:
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        self.config, self.tokenizer = config, tokenizer
        self.encoder = WhisperEncoder(config.encoder_config).eval()
        self.audio_adapter = AudioAdapter(
            config.whisper_feats_dim, config.llm_config.hidden_size, config.adapter_downsample
        ).eval()
        for prefix, module in (("encoder.", self.encoder), ("audio_adapter.", self.audio_adapter)):
            own = {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
            missing, _ = module.load_state_dict(own, strict=False)
            if missing:
                raise ValueError(f"model.safetensors: {prefix}{missing[0]} is missing")
        self.embed = weights["llm.model.embed_tokens.weight"]
        self.filters = slaney_filters(config.encoder_config.num_mel_bins)
        self.marker_ids = [tokenizer.convert_tokens_to_ids(t) for t in self.tokens.audio]

    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        return frozenset({"audio"} if getattr(config, "model_type", None) == cls.model_type else ())

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> CovoAudioInputEncoder:
        from transformers import AutoTokenizer

        from omnistage.families.covo_audio.config import CovoAudioConfig

        config = CovoAudioConfig.from_pretrained(path)
        weights: dict[str, torch.Tensor] = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                weights.update(safetensors.torch.load_file(os.path.join(path, name)))
        encoder = cls(config, AutoTokenizer.from_pretrained(path, config=config), weights)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        encoder.encoder.to(dtype)
        encoder.audio_adapter.to(dtype)
        encoder.embed = encoder.embed.to(dtype)
        return encoder

    @torch.no_grad()
    def clip_features(self, wave: np.ndarray) -> torch.Tensor:
        """`[tokens, hidden]` rows of one 16 kHz mono clip."""
        wave_t = torch.as_tensor(np.asarray(wave, dtype=np.float32)).reshape(-1)
        wave_t = wave_t[: wave_t.numel() // _HOP * _HOP]
        if wave_t.numel() == 0:
            raise ValueError("audio: the clip is shorter than 10 ms")
        count = audio_token_count(wave_t.numel())
        dtype = self.embed.dtype
        mels = [
            log_mel(F.pad(s, (0, SEGMENT - s.numel())), self.filters) for s in wave_t.split(SEGMENT)
        ]
        hidden = self.encoder(torch.stack(mels).to(dtype)).last_hidden_state
        return self.audio_adapter(hidden).reshape(-1, self.embed.shape[1])[:count]

    def _ids(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt, add_special_tokens=False))
        return [int(t) for t in prompt]

    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> EncodedPrompt:
        """Expand each `<|cAUDIO|>` of `prompt` for its clip (`(samples, 16000)` pairs, in
        order) and build the prompt's input rows."""
        if images:
            raise ValueError("image: Covo-Audio takes audio and text only")
        start, pad, end = self.marker_ids
        ids = self._ids(prompt)
        slots = [i for i, t in enumerate(ids) if t == pad]
        if any(
            not (0 < i < len(ids) - 1 and ids[i - 1] == start and ids[i + 1] == end) for i in slots
        ):
            raise ValueError(
                f"prompt: each audio placeholder must be exactly {self.tokens.placeholder('audio')!r}"
            )
        if len(slots) != len(audios):
            raise ValueError(
                f"prompt: {len(slots)} audio placeholder(s) but {len(audios)} audio input(s)"
            )
        features = []
        for item in audios:
            wave, rate = item if isinstance(item, tuple) else (item, RATE)
            if int(rate) != RATE:
                raise ValueError(f"audio: expected {RATE} Hz samples, got {rate} Hz")
            features.append(self.clip_features(wave))
        counts = dict(zip(slots, (f.shape[0] for f in features), strict=True))
        expanded = [t for i, tok in enumerate(ids) for t in [tok] * counts.get(i, 1)]
        ids_t = torch.tensor(expanded, dtype=torch.long)
        if int(ids_t.max()) >= self.embed.shape[0] or int(ids_t.min()) < 0:
            raise ValueError("prompt: token id outside the vocabulary")
        embeds = self.embed[ids_t].clone()
        mask = ids_t == pad
        if features:
            embeds[mask] = torch.cat(features).to(embeds.dtype)
        return EncodedPrompt.audio_only(expanded, embeds, mask, [f.shape[0] for f in features])
