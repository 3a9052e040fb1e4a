"""The MiMo-Audio tokenizer's encoder: a clip's samples -> its residual-quantizer codes.

As the reference (`mimo_audio/mimo_audio.py` `MimoAudio.preprocess_input` and
`mimo_audio_tokenizer/modeling_audio_tokenizer.py` `AudioEncoder.encode`): the log-mel
spectrogram (`wav2mel`: torchaudio's `MelSpectrogram` with `power=1`, `center=True`,
HTK mel scale, no filter norm, then `log(clip(., 1e-7))`), cut into segments of
`SEGMENT_FRAMES` mel frames encoded independently; per segment two GELU convolutions
(the second strided), the transformer (RoPE from 0 per segment), the skip connection
and layer norm, the pooling convolution (+ GELU, norm), then the residual quantizer
(nearest codebook row by the reference's distance, float32). Segments are batched as
the reference batches them: a segment shorter than the longest of its batch pools its
odd last frame with a copy of itself, the longest with zeros, and its convolutions see
its zero padding up to the longest (the reference's packed batch). Tensors under `encoder.`
by the reference's names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.mimo_audio.audio_decoder import _Layer, _norm, rope, window_mask
from omnistage.families.mimo_audio.config import AudioEncoderConfig

SEGMENT_FRAMES = 6000
"""Mel frames per independently encoded segment (`preprocess_input`'s `segment_size`)."""
BATCH_FRAMES = 256000
"""Mel frames per encoder batch (`encode_batch`'s `max_length`)."""
UNUSED = (".inited", ".cluster_size", ".embed_avg")
"""Quantizer training state in the checkpoint that encoding does not read."""


def mel_filters(c: AudioEncoderConfig) -> torch.Tensor:
    """[n_fft/2 + 1, n_mels] triangular HTK-mel filters, unnormalized (torchaudio's
    `melscale_fbanks(norm=None, mel_scale="htk")`)."""
    freqs = torch.linspace(0, c.sampling_rate // 2, c.nfft // 2 + 1)
    fmax = float(c.fmax) if c.fmax is not None else float(c.sampling_rate // 2)

    def to_mel(f: float) -> float:
        return 2595.0 * math.log10(1.0 + f / 700.0)

    mels = torch.linspace(to_mel(float(c.fmin)), to_mel(fmax), c.n_mels + 2)
    hz = 700.0 * (10 ** (mels / 2595.0) - 1.0)
    diff = hz[1:] - hz[:-1]
    slopes = hz[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    return torch.clamp(torch.minimum(down, up), min=0.0)


def wav2mel(wav: torch.Tensor, c: AudioEncoderConfig) -> torch.Tensor:
    """[samples] at `c.sampling_rate` -> [frames, n_mels] log-mel features (float32)."""
    wav = wav.float()
    window = torch.hann_window(c.window_size)
    spec = torch.stft(
        wav, c.nfft, c.hop_length, c.window_size, window, center=True, pad_mode="reflect",
        normalized=False, onesided=True, return_complex=True,
    ).abs()  # fmt: skip
    mel = (spec.transpose(0, 1) @ mel_filters(c)).clamp(min=1e-7)
    return torch.log(mel)


class _Codebook(nn.Module):
    def __init__(self, size: int, width: int) -> None:
        super().__init__()
        self.register_buffer("embed", torch.zeros(size, width))


class _VQLayer(nn.Module):
    def __init__(self, size: int, width: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, width)


class _Quantizer(nn.Module):
    def __init__(self, c: AudioEncoderConfig) -> None:
        super().__init__()
        self.vq = nn.Module()
        self.vq.layers = nn.ModuleList(_VQLayer(n, c.d_model) for n in c.codebook_sizes)

    def encode(self, x: torch.Tensor, n_q: int) -> torch.Tensor:
        """[T, d] -> [n_q, T] codes, residual by residual (float32, as the reference)."""
        residual, out = x.float(), []
        for layer in list(self.vq.layers)[:n_q]:
            embed = layer._codebook.embed.float()
            dist = -(
                residual.pow(2).sum(1, keepdim=True)
                - 2 * residual @ embed.t()
                + embed.t().pow(2).sum(0, keepdim=True)
            )
            codes = dist.max(dim=-1).indices
            residual = residual - F.embedding(codes, embed)
            out.append(codes)
        return torch.stack(out)


class AudioEncoder(nn.Module):
    """`encoder.` of the tokenizer checkpoint: log-mel frames -> codes."""

    def __init__(self, c: AudioEncoderConfig) -> None:
        super().__init__()
        self.config = c
        self.conv1 = nn.Conv1d(c.n_mels, c.d_model, c.kernel_size, padding=1)
        self.conv2 = nn.Conv1d(c.d_model, c.d_model, c.kernel_size, c.stride_size, padding=1)
        self.layers = nn.ModuleList(
            _Layer(
                c.d_model,
                c.encoder_attention_heads,
                c.encoder_ffn_dim,
                c.ln_type,
                c.activation_function,
            )
            for _ in range(c.encoder_layers)
        )
        self.layer_norm = _norm(c.ln_type, c.d_model)
        if c.avg_pooler != 1:
            pool = nn.Conv1d(c.d_model, c.d_model, c.avg_pooler, c.avg_pooler, bias=False)
            self.down_sample_layer = nn.Sequential(pool, nn.GELU())
            self.down_sample_norm = _norm(c.ln_type, c.d_model)
        else:
            self.down_sample_layer = None
        self.quantizer = _Quantizer(c)

    def output_length(self, mel_frames: int) -> int:
        """Frames after the input convolutions (the reference's `get_output_length`)."""
        k = self.config.kernel_size
        return (mel_frames + 3 - k + 2 - k) // self.config.stride_size + 1

    def _frames(self, mel: torch.Tensor, longest: int) -> torch.Tensor:
        """One segment: [mel frames, n_mels] -> [T, d] before pooling. The convolutions
        run over the segment zero-padded to the longest of its batch, as the reference's
        batch does: its last frames see the first convolution's output past its end."""
        c = self.config
        n = self.output_length(mel.shape[0])
        padded = F.pad(mel, (0, 0, 0, longest - mel.shape[0]))
        x = F.gelu(self.conv1(padded.T[None].to(self.conv1.weight)))
        x = F.gelu(self.conv2(x))[0].T[:n]
        cos, sin = rope(n, c.d_model // c.encoder_attention_heads, c.rope_theta, x.dtype, x.device)
        mask = window_mask(n, c.encoder_attn_window_size, c.encoder_causal, x.device)
        skip: torch.Tensor | float = 0.0
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask)
            if c.encoder_skip_layer_id is not None and i == c.encoder_skip_layer_id - 1:
                skip = x.clone()
        return self.layer_norm(x + skip)

    def _pool(self, x: torch.Tensor, longest: int) -> torch.Tensor:
        """[T, d] -> [ceil(T / avg_pooler), d]; the odd tail pooled as the reference's batch
        pads it (zeros up to a multiple for the longest; itself repeated up to the
        longest for a shorter segment, then zeros)."""
        p = self.config.avg_pooler
        if self.down_sample_layer is None:
            return x
        n = x.shape[0]
        if n < longest:
            x = torch.cat([x, x[-1:].expand(longest - n, -1)])
        x = F.pad(x, (0, 0, 0, -x.shape[0] % p))
        y = self.down_sample_layer(x.T[None])[0].T[: -(-n // p)]
        return self.down_sample_norm(y)

    @torch.no_grad()
    def encode(self, mel: torch.Tensor, n_q: int | None = None) -> torch.Tensor:
        """[mel frames, n_mels] -> [frames, n_q] codes (all quantizers by default)."""
        n_q = n_q or self.config.num_quantizers
        segments = list(torch.split(mel, SEGMENT_FRAMES))
        out, batch, total = [], [], 0
        for seg in [*segments, None]:
            if seg is None or (batch and total + seg.shape[0] > BATCH_FRAMES):
                longest_mel = max(s.shape[0] for s in batch)
                frames = [self._frames(s, longest_mel) for s in batch]
                longest = max(f.shape[0] for f in frames)
                out += [self.quantizer.encode(self._pool(f, longest), n_q) for f in frames]
                batch, total = [], 0
            if seg is not None:
                batch.append(seg)
                total += seg.shape[0]
        return torch.cat(out, dim=1).T


def load_audio_encoder(folder: Path, dtype: torch.dtype = torch.float32) -> AudioEncoder:
    """The encoder of the tokenizer checkpoint `folder` (`config.json`, `model.safetensors`),
    every `encoder.` tensor but the quantizer's training state loaded strictly; ValueError
    naming the file when one is missing."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise ValueError(f"model: {folder / name} is missing (the MiMo-Audio-Tokenizer)")
    config = AudioEncoderConfig.from_dict(json.loads((folder / "config.json").read_text()))
    weights = {
        k.removeprefix("encoder."): v
        for k, v in load_file(str(folder / "model.safetensors")).items()
        if k.startswith("encoder.") and not k.endswith(UNUSED)
    }
    encoder = AudioEncoder(config)
    encoder.load_state_dict(weights, strict=True)
    return encoder.to(dtype).eval()
