"""Ming-flash-omni-2.0's audio VAE decoder: continuous latents -> waveform, the generation
stage after the talker (inclusionAI/Ming-omni-tts `audio_tokenizer/vae_modules.py`
`Decoder.low_level_reconstruct`, `istft.py` `ISTFTHead`; the decoder without the optional
semantic (Whisper) module, which the decode path of a checkpoint without
`semantic_module_kwargs` skips).

    latents [T, C] -> fc1 -> linear upsampling x patch_size (align_corners False)
      -> a causal Qwen2 (transformers' Qwen2Model, inputs_embeds) -> ISTFT head:
         out linear -> (log-magnitude, phase) -> |S| = min(exp, 100), S = |S| e^{i phase}
         -> irfft(n_fft = 4 hop) x Hann window, overlap-add, "same" padding trimmed,
            divided by the summed squared window.

A whole payload is decoded at once (the reference's `use_cache=False` path). A stream's
chunks (the `-tts` deploys' `transfer: stream` edge, one patch of right context) decode
one after another through the stream's `VAEStream` (`audio_vae_stream.py`, kept in the
stream's `GenerationItem.state`): the Qwen2 is causal, the upsampler reads one latent
frame ahead and the ISTFT of a frame's samples two upsampled frames ahead, all inside the
next patch, so each chunk's samples are the whole decode's up to float rounding (as the
reference's streamed decode, a one-frame look-ahead upsampler with a KV cache and overlap
buffers, computes them), and each latent frame is decoded once (before, every chunk
decoded the whole utterance so far again: quadratic time in its length).
Weights: `talker.audio.decoder.*` of the checkpoint (the reference's names under `audio.`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.ming_flash_omni.audio_vae_stream import VAEStream, decode_chunk
from omnistage.models.generation import GenerationItem, GenerationModel, load_part_module
from omnistage.models.stream_states import StreamStates

PREFIX = "talker.audio.decoder."
STREAM_KEY = "vae_stream"
"""Where a stream's `VAEStream` lives in `GenerationItem.state`."""
TINY_VAE = dict(
    latent_dim=8,
    patch_size=4,
    hop_length=16,
    sample_rate=16000,
    decoder=dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=8,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
    ),
)
"""A tiny decoder: 8 latent channels, 4x upsampling, 16 samples per upsampled frame."""


def _qwen2_config(sizes: dict[str, Any]) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**sizes)


def vae_weight_shapes(settings: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The decoder's weight names (under `audio.decoder.`) and shapes."""
    decoder = AudioVAEDecoder(settings, torch.float32)
    return {k: tuple(v.shape) for k, v in decoder.state_dict().items() if "window" not in k}


class ISTFTHead(nn.Module):
    """Linear -> complex spectrum -> ISTFT with "same" padding (see the module docstring)."""

    def __init__(self, dim: int, hop_length: int) -> None:
        super().__init__()
        self.n_fft, self.hop = 4 * hop_length, hop_length
        self.out = nn.Linear(dim, self.n_fft + 2)
        self.register_buffer("window", torch.hann_window(self.n_fft), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, L, dim] -> [B, L * hop] samples."""
        y, envelope = self._overlap_add(x)
        pad = (self.n_fft - self.hop) // 2
        return y[:, pad:-pad] / envelope[pad:-pad]

    def samples(self, x: torch.Tensor, first: int, start: int, stop: int) -> torch.Tensor:
        """The samples of frames `start..stop-1` from the hidden frames `x` [B, n, dim] of
        frames `first..first+n-1`: as `forward` over every frame gives them where `x`
        holds the frames whose windows reach them (`HEAD_OVERLAP` on each side, or the
        utterance's start or end)."""
        y, envelope = self._overlap_add(x)
        pad = (self.n_fft - self.hop) // 2
        a, b = (start - first) * self.hop + pad, (stop - first) * self.hop + pad
        return y[:, a:b] / envelope[a:b]

    def _overlap_add(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windowed frames' overlap-add [B, (L - 1) * hop + n_fft] and the summed
        squared window, untrimmed."""
        mag, phase = self.out(x).transpose(1, 2).chunk(2, dim=1)
        spec = torch.clip(torch.exp(mag), max=1e2) * (torch.cos(phase) + 1j * torch.sin(phase))
        window = self.window.to(x.dtype)
        frames = torch.fft.irfft(spec, self.n_fft, dim=1, norm="backward") * window[None, :, None]
        n = frames.shape[-1]
        size = (n - 1) * self.hop + self.n_fft
        fold = dict(output_size=(1, size), kernel_size=(1, self.n_fft), stride=(1, self.hop))
        y = F.fold(frames, **fold)[:, 0, 0, :]
        envelope = F.fold(window.square().expand(1, n, -1).transpose(1, 2), **fold)[0, 0, 0]
        return y, envelope


class AudioVAEDecoder(nn.Module):
    """fc1 -> upsampling -> Qwen2 -> ISTFT head."""

    def __init__(self, settings: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        from transformers import Qwen2Model

        for name in ("latent_dim", "patch_size", "hop_length", "decoder"):
            if name not in settings:
                raise ValueError(f"talker_config.audio_vae.{name}: missing")
        config = _qwen2_config(settings["decoder"])
        self.patch_size = int(settings["patch_size"])
        if self.patch_size < 1:
            raise ValueError(f"talker_config.audio_vae.patch_size: {self.patch_size} must be >= 1")
        self.fc1 = nn.Linear(int(settings["latent_dim"]), config.hidden_size)
        self.decoder = Qwen2Model(config)
        self.head = ISTFTHead(config.hidden_size, int(settings["hop_length"]))
        self.to(dtype)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, T, C] -> waveform [B, T * patch_size * hop]."""
        x = self.fc1(latents).transpose(1, 2)
        x = F.interpolate(x, scale_factor=self.patch_size, mode="linear", align_corners=False)
        x = self.decoder(inputs_embeds=x.transpose(1, 2)).last_hidden_state
        return self.head(x)


class MingFlashAudioVAE(GenerationModel):
    """The generation part `audio_vae`: a request's latent frames -> its waveform."""

    architectures = ("OmnistageMingFlashAudioVAE",)
    output_modality = "audio"

    def __init__(self, settings: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        self.decoder = AudioVAEDecoder(settings, dtype)
        self.latent_dim = int(settings["latent_dim"])
        self.sample_rate = int(settings.get("sample_rate", 16000))
        self.dtype = dtype

    @classmethod
    def from_checkpoint(cls, path: Path, hf_config: Any, dtype: torch.dtype) -> MingFlashAudioVAE:
        talker = getattr(hf_config, "talker_config", None)
        if talker is None or not talker.audio_vae:
            raise ValueError(f"{path}: config.json has no talker_config.audio_vae")
        model = cls(talker.audio_vae, dtype)
        load_part_module(model.decoder, Path(path), PREFIX, "the audio VAE decoder")
        return model.eval()

    def check_item(self, item: GenerationItem) -> None:
        rows = item.rows
        if rows.ndim != 2 or rows.shape[1] % self.latent_dim or rows.shape[0] == 0:
            raise ValueError(
                f"latents.output: expected [frames, k * {self.latent_dim}] rows, got "
                f"{tuple(rows.shape)}"
            )

    @torch.no_grad()
    def generate(self, items: list[GenerationItem]) -> list[torch.Tensor]:
        """Each item alone (the Qwen2 is causal over the whole utterance: no padding); a
        stream's chunks through its `VAEStream` (see the module docstring), advanced
        only when the whole call went well, in order also within one call."""
        out, streams = [], StreamStates(STREAM_KEY)
        for item in items:
            frames = item.rows.reshape(1, -1, self.latent_dim).to(self.dtype)
            per_row = frames.shape[1] // item.rows.shape[0]
            stream = streams.kept(item)
            if item.state is None or (stream is None and item.last):  # a whole payload
                wav = self.decoder(frames)[0]
                per_row = wav.shape[0] // item.rows.shape[0]
                out.append(wav[item.context_len * per_row : item.own_end * per_row].float())
                continue
            skip = 0 if stream is not None else item.context_len * per_row
            own = (item.own_end - item.context_len) * per_row
            if own == 0:  # e.g. an empty last chunk
                out.append(torch.zeros(0))
                continue
            if stream is not None:  # the context rows were decoded with their own chunks
                frames = frames[:, item.context_len * per_row :]
            wav, after = decode_chunk(
                self.decoder, stream or VAEStream(), frames, skip, own, item.last
            )
            streams.advance(item, after)
            out.append(wav[0].float())
        streams.commit()
        return out
