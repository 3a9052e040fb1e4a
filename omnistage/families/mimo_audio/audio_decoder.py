"""The MiMo-Audio tokenizer's decoder: codes -> waveform, by the checkpoint's names.

The reference (`mimo_audio_tokenizer/modeling_audio_tokenizer.py`, `MiMoAudioTokenizer.
decode`) sums the residual quantizer's codebook rows of a sequence's codes
(`encoder.quantizer.vq.layers.{i}._codebook.embed`), then `decoder.`:

    dconv1   transposed conv (k = s = avg_pooler) + GroupNorm(1)      [T, d] -> [T*p, d]
    layers   pre-norm transformer (causal, RoPE, attention window)
    dconv2   transposed conv (k, s) + GroupNorm(1), right-trimmed      -> [T*p*s, n_mels]
    vocoder  linear, transformer (window (40, 10)), LayerNorm, ISTFT head -> samples

GroupNorm(1) normalizes over the whole sequence, so a sequence's audio depends on all
of its codes: the `code2wav` part decodes fixed segments (`code2wav.py`), the
`code2wav_stream` part the reference's `streaming_decode` windows (`streaming.py`). Attention is the reference's `flash_attn_varlen_func` with its
`window_size` (left, right; -1 unbounded) on one sequence, written here as SDPA with a
boolean mask.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from omnistage.families.mimo_audio.config import AudioDecoderConfig


class _RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)
        return self.weight * h


def _norm(kind: str, width: int) -> nn.Module:
    return nn.LayerNorm(width) if kind == "LayerNorm" else _RMSNorm(width)


def rope(length: int, dim: int, theta: float, dtype: torch.dtype, device) -> tuple:
    """cos, sin [length, dim] of positions 0..length-1 (float32 angles, as the reference)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq).to(device)
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def window_mask(length: int, window: tuple[int, int], causal: bool, device) -> torch.Tensor:
    """[length, length] True where query i may attend key j (flash-attn's `window_size`)."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    left, right = window
    allowed = torch.ones(length, length, dtype=torch.bool, device=device)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    return allowed


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=True)
        self.q_proj = nn.Linear(width, width, bias=True)
        self.out_proj = nn.Linear(width, width, bias=True)

    def forward(self, x: torch.Tensor, cos, sin, mask: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]

        def heads(p: nn.Module, rotate: bool) -> torch.Tensor:
            h = p(x).view(n, self.heads, self.head_dim)
            if rotate:
                half = self.head_dim // 2
                turned = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
                h = h * cos[:, None] + turned * sin[:, None]
            return h.transpose(0, 1)

        q, k, v = heads(self.q_proj, True), heads(self.k_proj, True), heads(self.v_proj, False)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(0, 1).reshape(n, -1))


class _Layer(nn.Module):
    def __init__(self, width: int, heads: int, ffn: int, ln_type: str, act: str) -> None:
        super().__init__()
        self.self_attn = _Attention(width, heads)
        self.self_attn_layer_norm = _norm(ln_type, width)
        self.fc1 = nn.Linear(width, ffn)
        self.fc2 = nn.Linear(ffn, width)
        self.final_layer_norm = _norm(ln_type, width)
        self.act = ACT2FN[act]

    def forward(self, x: torch.Tensor, cos, sin, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), cos, sin, mask)
        return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))


class _TransposedConv(nn.Module):
    """The reference's `CausalConvTranspose1d` on one sequence: [T, in] -> [T', out]."""

    def __init__(self, n_in: int, n_out: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(n_in, n_out, kernel, stride)
        self.norm = nn.GroupNorm(1, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, stride = self.conv.kernel_size[0], self.conv.stride[0]
        y = self.norm(self.conv(x.T[None]))[0].T
        trim = max(0, kernel - stride)
        return y[: y.shape[0] - trim]


class _ISTFTHead(nn.Module):
    def __init__(self, width: int, nfft: int, hop: int, padding: str) -> None:
        super().__init__()
        self.out = nn.Linear(width, nfft + 2)
        self.istft = nn.Module()
        self.istft.register_buffer("window", torch.hann_window(nfft))
        self.nfft, self.hop, self.padding = nfft, hop, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[frames, width] -> [frames * hop] samples (the reference's ISTFT, "same")."""
        mag, phase = self.out(x).T.chunk(2, dim=0)
        mag = torch.clip(torch.exp(mag), max=1e2)
        spec = mag.float() * (torch.cos(phase).float() + 1j * torch.sin(phase).float())
        window = self.istft.window.to(spec.real.dtype)
        if self.padding == "center":
            return torch.istft(spec[None], self.nfft, self.hop, self.nfft, window, center=True)[0]
        frames = spec.shape[1]
        pad = (self.nfft - self.hop) // 2
        ifft = torch.fft.irfft(spec, self.nfft, dim=0, norm="backward") * window[:, None]
        size = (frames - 1) * self.hop + self.nfft
        fold = dict(output_size=(1, size), kernel_size=(1, self.nfft), stride=(1, self.hop))
        y = F.fold(ifft[None], **fold)[0, 0, 0, pad:-pad]
        envelope = window.square().expand(1, frames, -1).transpose(1, 2)
        envelope = F.fold(envelope, **fold).squeeze()[pad:-pad]
        return (y / envelope).to(x.dtype)


class _Vocoder(nn.Module):
    def __init__(self, c: AudioDecoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embeddings = nn.Linear(c.n_mels, c.vocoder_dim, bias=False)
        self.layers = nn.ModuleList(
            _Layer(
                c.vocoder_dim,
                c.vocoder_attention_heads,
                c.vocoder_intermediate_dim,
                c.ln_type,
                c.activation_function,
            )
            for _ in range(c.vocoder_num_layers)
        )
        self.layer_norm = _norm(c.ln_type, c.vocoder_dim)
        self.head = _ISTFTHead(c.vocoder_dim, c.nfft, c.hop_length, c.vocoder_padding)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = self.embeddings(mel)
        n = x.shape[0]
        cos, sin = rope(
            n, c.vocoder_dim // c.vocoder_attention_heads, c.rope_theta, x.dtype, x.device
        )
        mask = window_mask(n, c.vocoder_attn_window_size, False, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(self.layer_norm(x))


class AudioDecoder(nn.Module):
    """`decoder.` of the tokenizer checkpoint: [T, d_model] quantized frames -> samples."""

    def __init__(self, c: AudioDecoderConfig) -> None:
        super().__init__()
        self.config = c
        p = c.avg_pooler
        self.dconv1 = _TransposedConv(c.d_model, c.d_model, p, p) if p != 1 else None
        self.layers = nn.ModuleList(
            _Layer(
                c.d_model,
                c.decoder_attention_heads,
                c.decoder_ffn_dim,
                c.ln_type,
                c.activation_function,
            )
            for _ in range(c.decoder_layers)
        )
        self.layer_norm = _norm(c.ln_type, c.d_model)
        self.dconv2 = _TransposedConv(
            c.d_model, c.n_mels, c.decoder_kernel_size, c.decoder_stride_size
        )
        self.vocoder = _Vocoder(c)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        c = self.config
        x = frames if self.dconv1 is None else self.dconv1(frames)
        n = x.shape[0]
        cos, sin = rope(n, c.d_model // c.decoder_attention_heads, c.rope_theta, x.dtype, x.device)
        mask = window_mask(n, c.decoder_attn_window_size, c.decoder_causal, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.vocoder(self.dconv2(self.layer_norm(x)))


class Codebooks(nn.Module):
    """The residual quantizer's codebooks the decoder reads (`encoder.quantizer.vq.
    layers.{i}._codebook.embed`): codes [T, channels] -> the sum of their rows [T, d]."""

    def __init__(self, c: AudioDecoderConfig, channels: int) -> None:
        super().__init__()
        self.tables = nn.ParameterList(
            nn.Parameter(torch.zeros(n, c.d_model)) for n in c.codebook_sizes[:channels]
        )

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        out = F.embedding(codes[:, 0], self.tables[0])
        for i in range(1, codes.shape[1]):
            out = out + F.embedding(codes[:, i], self.tables[i])
        return out
