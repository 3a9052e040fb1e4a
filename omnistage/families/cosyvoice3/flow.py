"""CosyVoice3's flow-matching decoder: speech tokens (+ a voice prompt) -> 80-bin mel.

A port of the reference `CausalMaskedDiffWithDiT.inference` with its
`CausalConditionalCFM` solver (FunAudioLLM/CosyVoice, `cosyvoice/flow/`):

    x-vector ─normalize─ spk_embed_affine_layer ─────────────────────────── spks
    [prompt tokens | tokens] ─input_embedding─ pre_lookahead_layer ─x2 repeat── mu
    [prompt mel | zeros] ──────────────────────────────────────────────── cond
    fixed noise[:N] ─ Euler, 10 cosine-spaced steps of the DiT velocity with
                      classifier-free guidance ─ mel; the prompt's frames dropped

This module owns the config (`FlowConfig`), the pre-lookahead conv (`PreLookaheadLayer`),
the Euler solver (`FlowMatchingSolver`, the reference's `decoder`) and `CosyVoice3Flow`,
whose state-dict names equal the reference's (`flow.pt` loads strictly). The estimator
network is `dit.py`.

Streaming: with `finalize=False` the last `pre_lookahead_len` tokens are right context
for the pre-lookahead conv only (no frames are made for them), and `streaming=True`
attends with the static chunk mask (`static_chunk_size` mel frames), so the frames of a
chunk do not depend on later chunks. The noise is fixed (drawn once at construction
from seed 0, as the reference does), so re-decoding a longer prefix reproduces the
frames already emitted up to the chunk boundary.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.cosyvoice3.dit import AttentionMask, DiT, RowMasks, rope_inv_freq
from omnistage.families.cosyvoice3.flow_batch import (
    PADDING_SLACK,
    FlowRequest,
    attention_mask,
    length_groups,
    pad_rows,
)

MEL_DIM = 80  # the reference's solver and fixed noise hard-code 80 mel bins
NOISE_FRAMES = 50 * 300  # the fixed noise's length: 300 s of mel at 50 Hz
NOISE_SEED = 0
T_SCHEDULERS = ("cosine", "linear")


@dataclasses.dataclass(frozen=True)
class FlowConfig:
    """The `flow:` section of CosyVoice3's `cosyvoice3.yaml`; defaults are the released
    Fun-CosyVoice3-0.5B's."""

    input_size: int = 80
    """Width of the speech-token embedding (= the pre-lookahead conv's in/out, `mu`)."""
    output_size: int = 80
    """Mel bins (the projected speaker vector has this width too)."""
    spk_embed_dim: int = 192
    """Width of the CAM++ x-vector the caller passes."""
    vocab_size: int = 6561
    """Speech-token vocabulary."""
    token_mel_ratio: int = 2
    """Mel frames per speech token (25 Hz tokens, 50 Hz mel)."""
    pre_lookahead_len: int = 3
    """Future tokens the pre-lookahead conv reads (its kernel is this + 1)."""
    pre_lookahead_channels: int = 1024
    """Hidden channels of the pre-lookahead conv."""
    dit_dim: int = 1024
    """DiT width (a multiple of 16: the conv position embedding has 16 groups)."""
    dit_depth: int = 22
    """DiT blocks."""
    dit_heads: int = 16
    """Attention heads."""
    dit_dim_head: int = 64
    """Width of one head (and of the rotary embedding: even)."""
    dit_ff_mult: int = 2
    """Feed-forward width over `dit_dim`."""
    static_chunk_size: int = 50
    """Attention chunk in mel frames when streaming (chunk_size 25 x token_mel_ratio);
    0 attends to every frame even when streaming (the reference's meaning of 0)."""
    n_timesteps: int = 10
    """Euler steps."""
    inference_cfg_rate: float = 0.7
    """Classifier-free guidance: `(1 + rate) * v_cond - rate * v_uncond`."""
    sigma_min: float = 1e-6
    """The training path's minimum noise; unused at inference (kept for the config)."""
    t_scheduler: str = "cosine"
    """Step spacing: "cosine" (`1 - cos(t * pi / 2)`) or "linear"."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"flow config {field.name}: an int, got {value!r}")
            if field.type == "float" and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ValueError(f"flow config {field.name}: a number, got {value!r}")
            if field.type == "int" and value < (0 if field.name == "static_chunk_size" else 1):
                raise ValueError(f"flow config {field.name}: out of range, got {value}")
        for name in ("input_size", "output_size"):
            if getattr(self, name) != MEL_DIM:
                raise ValueError(f"flow config {name}: the reference's solver is {MEL_DIM}-wide")
        if self.dit_dim % 16:
            raise ValueError(f"flow config dit_dim: a multiple of 16, got {self.dit_dim}")
        if self.dit_dim_head % 2:
            raise ValueError(f"flow config dit_dim_head: even, got {self.dit_dim_head}")
        if not (self.inference_cfg_rate >= 0 and math.isfinite(self.inference_cfg_rate)):
            raise ValueError(f"flow config inference_cfg_rate: >= 0, got {self.inference_cfg_rate}")
        if self.t_scheduler not in T_SCHEDULERS:
            raise ValueError(
                f"flow config t_scheduler: one of {T_SCHEDULERS}, got {self.t_scheduler!r}"
            )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FlowConfig:
        """A config from these field names (ValueError naming an unknown or bad one)."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in names:
                raise ValueError(f"flow config {key}: unknown field")
        return cls(**raw)


class PreLookaheadLayer(nn.Module):
    """Residual token-rate conv that sees `pre_lookahead_len` tokens ahead, then 2 back.

    `inputs [B, n, C]`; `context [B, pre_lookahead_len, C]` are the tokens after them
    (zeros when None, as at the end of an utterance). Returns `[B, n, C]`."""

    def __init__(self, channels: int, hidden: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(channels, hidden, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(hidden, channels, kernel_size=3)

    def forward(self, inputs: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        x = inputs.transpose(1, 2)
        if context is None:
            x = F.pad(x, (0, self.lookahead))
        else:
            x = torch.cat((x, context.transpose(1, 2)), dim=2)
        x = F.leaky_relu(self.conv1(x))
        x = self.conv2(F.pad(x, (self.conv2.kernel_size[0] - 1, 0)))
        return x.transpose(1, 2) + inputs


class FlowMatchingSolver(nn.Module):
    """Euler ODE solver from the fixed noise to mel, with classifier-free guidance.

    Each step runs the estimator once on `2B` rows: the B items conditioned (mu, spks,
    cond), then the same B with all three zero; an item's velocity is
    `(1 + rate) * v_cond - rate * v_uncond`. Every row starts from the same noise
    `noise[:, :, :N]` (see `flow_batch` for rows padded to N)."""

    def __init__(self, estimator: DiT, noise: torch.Tensor, config: FlowConfig) -> None:
        super().__init__()
        self.estimator = estimator
        # [1, 80, NOISE_FRAMES]; moves and casts with the module, never saved
        self.register_buffer("rand_noise", noise, persistent=False)
        self.n_timesteps = config.n_timesteps
        self.cfg_rate = config.inference_cfg_rate
        self.t_scheduler = config.t_scheduler

    def time_span(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t_span = torch.linspace(0, 1, self.n_timesteps + 1, device=device, dtype=dtype)
        if self.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        return t_span

    def forward(
        self, mu: torch.Tensor, spks: torch.Tensor, cond: torch.Tensor, mask: AttentionMask
    ) -> torch.Tensor:
        """mu, cond `[B, N, 80]`, spks `[B, 80]`, mask as `DiT.forward` (`RowMasks` of the
        B items); returns `[B, N, 80]`."""
        batch = mu.shape[0]
        x = self.rand_noise[:, :, : mu.shape[1]].transpose(1, 2).to(mu.dtype)
        x = x.expand(batch, -1, -1)
        if isinstance(mask, RowMasks):
            mask = mask.repeated(2)
        mu_in = torch.cat((mu, torch.zeros_like(mu)))
        spks_in = torch.cat((spks, torch.zeros_like(spks)))
        cond_in = torch.cat((cond, torch.zeros_like(cond)))
        t_span = self.time_span(mu.dtype, mu.device)
        # t and dt advance as the reference's do (t += dt; dt = t_span[k+1] - t)
        t, dt = t_span[:1], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            # t: one row for the conditioned half, one for the unconditioned (as alone)
            v = self.estimator(torch.cat((x, x)), cond_in, mu_in, spks_in, t.expand(2), mask)
            v = (1.0 + self.cfg_rate) * v[:batch] - self.cfg_rate * v[batch:]
            x = x + dt * v
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x


class CosyVoice3Flow(nn.Module):
    """Speech tokens -> mel (the reference's `CausalMaskedDiffWithDiT`, inference only).

    Construction draws from torch's global CPU generator exactly as the reference's does
    (so that the vocoder built next draws the same fixed noise as the reference's): the
    pre-lookahead conv and the estimator are built first, without initialisation (on
    the meta device, then uninitialised CPU memory: their weights are always loaded),
    then `torch.manual_seed(0)`, the noise `torch.randn(1, 80, 15000)` (float32), then
    `input_embedding` and `spk_embed_affine_layer` with torch's default init (float32,
    CPU). This reseeds the global generator: callers wrap construction in
    `torch.random.fork_rng()` (the reference's `set_all_random_seed` also seeds Python's
    `random` and NumPy; nothing here uses them). Build, then `load_state_dict`, then
    move/cast: the module computes in its parameters' dtype (float32 or float64)."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        with torch.device("meta"):
            pre_lookahead = PreLookaheadLayer(
                config.input_size, config.pre_lookahead_channels, config.pre_lookahead_len
            )
            estimator = DiT(
                dim=config.dit_dim,
                depth=config.dit_depth,
                heads=config.dit_heads,
                dim_head=config.dit_dim_head,
                ff_mult=config.dit_ff_mult,
                mel_dim=config.output_size,
                mu_dim=config.input_size,
                spk_dim=config.output_size,
            )
        pre_lookahead.to_empty(device="cpu")
        estimator.to_empty(device="cpu")
        with torch.no_grad():
            estimator.rotary_embed.inv_freq.copy_(rope_inv_freq(config.dit_dim_head))

        torch.manual_seed(NOISE_SEED)
        noise = torch.randn(1, MEL_DIM, NOISE_FRAMES, dtype=torch.float32, device="cpu")
        cpu32: dict[str, Any] = {"dtype": torch.float32, "device": "cpu"}
        # registration order = the reference's (and so its state_dict order)
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size, **cpu32)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size, **cpu32)
        self.pre_lookahead_layer = pre_lookahead
        self.decoder = FlowMatchingSolver(estimator, noise, config)

    @torch.inference_mode()
    def inference(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        streaming: bool,
        finalize: bool,
    ) -> torch.Tensor:
        """Mel for `token`, in the voice of the prompt.

        token `[1, T]` and prompt_token `[1, P]` (P may be 0) are speech-token ids;
        prompt_feat `[1, P * token_mel_ratio, 80]` is the prompt's mel; embedding
        `[1, spk_embed_dim]` the x-vector. Floats are cast to the module's dtype and
        device. `finalize=False`: the last `pre_lookahead_len` tokens are right context
        only. `streaming=True`: chunked attention (see the module doc).
        Returns `[1, 80, (T or T - pre_lookahead_len) * token_mel_ratio]`, module dtype.
        ValueError names a bad argument."""
        self._check(token, prompt_token, prompt_feat, embedding, finalize)
        request = FlowRequest(
            token[0], prompt_token[0], prompt_feat[0], embedding[0], streaming, finalize
        )
        (mel,) = self._solve([request])
        return mel[None]

    @torch.inference_mode()
    def inference_batch(self, requests: list[FlowRequest]) -> list[torch.Tensor]:
        """`inference` for many requests at once: mel `[80, frames]` per request, from one
        solver run per group of similar lengths over the right-padded group (`flow_batch`),
        each equal to the request's `inference` alone. ValueError names a bad argument."""
        for r in requests:
            self._check(
                r.token[None],
                r.prompt_token[None],
                r.prompt_feat[None],
                r.embedding[None],
                r.finalize,
            )
        mels: list[torch.Tensor] = [torch.empty(0)] * len(requests)
        lengths = [self._frames(r) for r in requests]
        for group in length_groups(lengths, PADDING_SLACK):
            for i, mel in zip(group, self._solve([requests[i] for i in group]), strict=True):
                mels[i] = mel
        return mels

    def _frames(self, request: FlowRequest) -> int:
        kept = request.token.shape[0] - (0 if request.finalize else self.config.pre_lookahead_len)
        return (request.prompt_token.shape[0] + kept) * self.config.token_mel_ratio

    def _condition(self, request: FlowRequest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One request's (mu `[N, 80]`, cond `[N, 80]`, spks `[80]`), computed alone."""
        cfg = self.config
        param = self.spk_embed_affine_layer.weight
        prompt_feat = request.prompt_feat.to(device=param.device, dtype=param.dtype)
        embedding = request.embedding[None].to(device=param.device, dtype=param.dtype)
        spks = self.spk_embed_affine_layer(F.normalize(embedding, dim=1))
        token = request.token
        tokens = torch.cat((request.prompt_token.to(token.dtype), token)).to(param.device)
        emb = self.input_embedding(tokens[None])
        if request.finalize:
            h = self.pre_lookahead_layer(emb)
        else:
            lookahead = cfg.pre_lookahead_len
            h = self.pre_lookahead_layer(emb[:, :-lookahead], context=emb[:, -lookahead:])
        mu = h[0].repeat_interleave(cfg.token_mel_ratio, dim=0)
        cond = torch.zeros_like(mu)
        cond[: prompt_feat.shape[0]] = prompt_feat
        return mu, cond, spks[0]

    def _solve(self, requests: list[FlowRequest]) -> list[torch.Tensor]:
        conditions = [self._condition(r) for r in requests]
        lengths = [int(mu.shape[0]) for mu, _, _ in conditions]
        mu = pad_rows([c[0] for c in conditions])
        cond = pad_rows([c[1] for c in conditions])
        spks = torch.stack([c[2] for c in conditions])
        streaming = [r.streaming for r in requests]
        mask = attention_mask(lengths, streaming, self.config.static_chunk_size, mu.device)
        mel = self.decoder(mu, spks, cond, mask)
        return [
            mel[i, r.prompt_feat.shape[0] : n].transpose(0, 1)
            for i, (r, n) in enumerate(zip(requests, lengths, strict=True))
        ]

    def _check(
        self,
        token: torch.Tensor,
        prompt_token: torch.Tensor,
        prompt_feat: torch.Tensor,
        embedding: torch.Tensor,
        finalize: bool,
    ) -> None:
        cfg = self.config
        for name, ids in (("token", token), ("prompt_token", prompt_token)):
            if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.is_complex():
                raise ValueError(f"{name}: an integer tensor of speech-token ids")
            if ids.dim() != 2 or ids.shape[0] != 1:
                raise ValueError(f"{name}: shape [1, length], got {tuple(ids.shape)}")
            if ids.numel():
                low, high = torch.aminmax(ids)
                if int(low) < 0 or int(high) >= cfg.vocab_size:
                    raise ValueError(f"{name}: ids must lie in [0, {cfg.vocab_size})")
        shortest = 1 if finalize else cfg.pre_lookahead_len + 1
        if token.shape[1] < shortest:
            raise ValueError(
                f"token: at least {shortest} tokens (finalize={finalize}), got {token.shape[1]}"
            )
        n_prompt = prompt_token.shape[1] * cfg.token_mel_ratio
        if not isinstance(prompt_feat, torch.Tensor) or tuple(prompt_feat.shape) != (
            1,
            n_prompt,
            cfg.output_size,
        ):
            got = tuple(prompt_feat.shape) if isinstance(prompt_feat, torch.Tensor) else prompt_feat
            raise ValueError(f"prompt_feat: shape [1, {n_prompt}, {cfg.output_size}], got {got}")
        if not isinstance(embedding, torch.Tensor) or tuple(embedding.shape) != (
            1,
            cfg.spk_embed_dim,
        ):
            got = tuple(embedding.shape) if isinstance(embedding, torch.Tensor) else embedding
            raise ValueError(f"embedding: shape [1, {cfg.spk_embed_dim}], got {got}")
        kept = token.shape[1] - (0 if finalize else cfg.pre_lookahead_len)
        frames = (prompt_token.shape[1] + kept) * cfg.token_mel_ratio
        if frames > NOISE_FRAMES:
            raise ValueError(
                f"token: prompt + tokens make {frames} mel frames, past the fixed noise's "
                f"{NOISE_FRAMES}"
            )
