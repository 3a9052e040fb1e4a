"""The code predictor of a multi-codebook talker, and the talker behaviour built on it.

Qwen3-Omni's and Qwen3-TTS's talkers write one frame of `G` speech codes per step:
the decoder samples code 0 from its codec head; a small dense decoder (the
**code predictor**, with a fresh cache per frame) then writes codes 1..G-1 from
the decoder's final hidden state and code 0's embedding. `CodePredictingTalker`
gives a decoder class that behaviour: `sample()` returns all codes of each frame
(the runner keeps them in the request's history, `num_token_codes`), a frame fed
back is embedded as the sum of its codes' embeddings (`embed_token_codes`), and
the code predictor's weights load under `code_predictor.`.

Sampling is seeded per request and output position, as the default sampler's:
code 0 with the request's parameters (temperature 0 = greedy), codes 1..G-1
greedy for greedy requests, else with the talker's `code_predictor_params`
(`code_draws.py`). On the CPU in float32 a frame whose draws are temperature and top-k
only (every greedy frame; Qwen3-TTS's sampled ones) is one C call, draws included
(`DenseStep.frame`); others (top-p: Qwen3-Omni's sampled frames) draw code by code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.qwen3_omni.code_draws import code_predictor_metadata, frame_draws
from omnistage.layers.dense_step import (
    DenseLayerWeights,
    DenseStep,
    DenseWeights,
    FrameDraws,
    embedding_sum,
)
from omnistage.layers.linear import Embedding, Linear, load_shard
from omnistage.layers.norm import RMSNorm
from omnistage.layers.rotary import RotaryEmbedding, rotate
from omnistage.sample import Sampler, SamplingMetadata
from omnistage.sampling_params import SamplingParams

NUM_SUPPRESSED = 1024
"""The top ids of the talker vocabulary `generate` never samples (but `codec_eos`)."""

_PARTS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
"""Our fused projection -> the checkpoint's projections it holds, in row order."""
FUSED = {part: (fused, i) for fused, parts in _PARTS.items() for i, part in enumerate(parts)}
"""Checkpoint projection -> (our fused projection, its index among the parts)."""


class CodePredictorLayer(nn.Module):
    """A dense Qwen3 decoder layer (q/k norm, RoPE) over a short per-frame sequence."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        bias = getattr(config, "attention_bias", False)
        self.self_attn = nn.Module()
        attn = self.self_attn
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.part_rows = {
            "self_attn.qkv_proj": (q_size, kv_size, kv_size),
            "mlp.gate_up_proj": (config.intermediate_size,) * 2,
        }
        """Rows of each checkpoint projection inside our fused ones (`_PARTS` order)."""
        # q/k/v and gate/up are fused (one GEMM each; `FUSED` maps the checkpoint's names).
        attn.qkv_proj = Linear(hidden, q_size + 2 * kv_size, bias, dtype=dtype)
        attn.o_proj = Linear(q_size, hidden, bias, dtype=dtype)
        attn.q_norm = RMSNorm(self.head_dim, eps, dtype)
        attn.k_norm = RMSNorm(self.head_dim, eps, dtype)
        self.mlp = nn.Module()
        self.mlp.gate_up_proj = Linear(hidden, 2 * config.intermediate_size, False, dtype=dtype)
        self.mlp.down_proj = Linear(config.intermediate_size, hidden, False, dtype=dtype)
        self.input_layernorm = RMSNorm(hidden, eps, dtype)
        self.post_attention_layernorm = RMSNorm(hidden, eps, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: list[torch.Tensor],
    ) -> torch.Tensor:
        """x [B, T, H]; cos/sin [T, d]; `cache` ([k, v] of the earlier positions, or empty)
        is extended in place."""
        b, t, _ = x.shape
        attn = self.self_attn
        q, k, v = attn.qkv_proj(self.input_layernorm(x)).split(
            self.part_rows["self_attn.qkv_proj"], -1
        )
        q = attn.q_norm(q.reshape(b, t, self.num_heads, self.head_dim))
        k = attn.k_norm(k.reshape(b, t, self.num_kv_heads, self.head_dim))
        v = v.reshape(b, t, self.num_kv_heads, self.head_dim)
        cos, sin = cos[None, :, None], sin[None, :, None]
        q, k = rotate(q, cos, sin).transpose(1, 2), rotate(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
        gate, up = self.mlp.gate_up_proj(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.mlp.down_proj(F.silu(gate) * up)


class CodePredictor(nn.Module):
    """`talker.code_predictor`: writes a frame's codes 1..G-1 from the talker's state.

    `rotary` supplies the inverse frequencies (a transformers rotary module or
    `DefaultRope`); `talker_hidden` is the talker's width where it differs from the
    code predictor's: its codec embeddings are that wide and `small_to_mtp_projection`
    maps every input row down (Qwen3-TTS 1.7B)."""

    def __init__(
        self, config: Any, dtype: torch.dtype, rotary: Any, talker_hidden: int | None = None
    ) -> None:
        super().__init__()
        groups = config.num_code_groups
        embed_dim = talker_hidden or config.hidden_size
        self.num_codes = groups - 1
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(
            CodePredictorLayer(config, dtype) for _ in range(config.num_hidden_layers)
        )
        self.model.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.model.codec_embedding = nn.ModuleList(
            Embedding(config.vocab_size, embed_dim, dtype=dtype) for _ in range(self.num_codes)
        )
        self.lm_head = nn.ModuleList(
            Linear(config.hidden_size, config.vocab_size, False, dtype=dtype)
            for _ in range(self.num_codes)
        )
        self.small_to_mtp_projection = (
            Linear(embed_dim, config.hidden_size, True, dtype=dtype)
            if embed_dim != config.hidden_size
            else None
        )
        self.rotary = RotaryEmbedding(rotary, groups + 1, dtype)
        self.requires_grad_(False)
        self._step: DenseStep | None = None

    def _target(self, name: str) -> tuple[str, int | None]:
        """A checkpoint name -> (our parameter, row offset in a fused one, or None)."""
        for part, (fused, index) in FUSED.items():
            if f".{part}." in name:
                rows = self.model.layers[0].part_rows[fused]
                return name.replace(part, fused), sum(rows[:index])
        return name, None

    def load(self, name: str, tensor: torch.Tensor) -> None:
        """Load one tensor under its checkpoint name (`model.layers.0.self_attn.q_proj…`)."""
        target, offset = self._target(name)
        state = self.state_dict()
        if target not in state:
            raise ValueError(f"checkpoint tensor talker.code_predictor.{name} has no parameter")
        if offset is None:
            if state[target].shape != tensor.shape:
                raise ValueError(f"checkpoint tensor talker.code_predictor.{name} does not fit")
            state[target].copy_(tensor)
        else:
            load_shard(state[target], tensor, offset)

    def checkpoint_names(self) -> set[str]:
        """The checkpoint's names of every parameter (the fused ones by their parts)."""
        names = set()
        for name in self.state_dict():
            fused = next((f for f in _PARTS if f".{f}." in name), None)
            names |= {name.replace(fused, p) for p in _PARTS[fused]} if fused else {name}
        return names

    def embed(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, G-1] codes 1..G-1 -> the sum of their embeddings [n, H] (float32 CPU tables:
        one C call, the same sums in the same order)."""
        tables = self.model.codec_embedding
        if codes.dtype == torch.int64 and codes.ndim == 2 and codes.shape[1] == self.num_codes:
            summed = embedding_sum([e.weight for e in tables], codes)
            if summed is not None:
                return summed
        out = tables[0](codes[:, 0])
        for j in range(1, self.num_codes):
            out = out + tables[j](codes[:, j])
        return out

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        projection = self.small_to_mtp_projection
        return x if projection is None else projection(x)

    @property
    def keeps_plain_linears(self) -> bool:
        """Whether the platform must leave its `Linear`s unpacked (`pack_linears`): the C
        step reads their weights (float32 on the CPU with the C kernels built)."""
        return (
            self.model.norm.weight.dtype == torch.float32
            and not DenseStep.disabled()
            and DenseStep.kernels_built()
        )

    def _dense_weights(self) -> DenseWeights:
        layers = [
            DenseLayerWeights(
                input_norm=layer.input_layernorm.weight,
                qkv_w=layer.self_attn.qkv_proj.weight,
                qkv_b=layer.self_attn.qkv_proj.bias,
                q_norm=layer.self_attn.q_norm.weight,
                k_norm=layer.self_attn.k_norm.weight,
                o_w=layer.self_attn.o_proj.weight,
                o_b=layer.self_attn.o_proj.bias,
                post_norm=layer.post_attention_layernorm.weight,
                gate_up_w=layer.mlp.gate_up_proj.weight,
                down_w=layer.mlp.down_proj.weight,
            )
            for layer in self.model.layers
        ]
        p = self.small_to_mtp_projection
        return DenseWeights(
            layers,
            self.model.norm.weight,
            self.rotary.cos,
            self.rotary.sin,
            None if p is None else (p.weight, p.bias),
        )

    def dense_step(self) -> DenseStep | None:
        """The decoder's steps as one C call each (`layers/dense_step.py`), built on first
        use and again when a weight moved; None where that path does not apply (float64,
        not on the CPU, no C kernels, `OMNISTAGE_DISABLE_DECODE_PROGRAM` set): the torch
        path runs then."""
        if DenseStep.disabled():
            return None
        try:
            weights = self._dense_weights()
        except AttributeError:  # a Linear packed for oneDNN: no plain weight
            return None
        if self._step is None or not self._step.points_into(weights):
            if any(
                isinstance(m, nn.Linear)
                and not isinstance(getattr(m, "weight", None), torch.Tensor)
                for m in self.modules()
            ):  # packed for oneDNN (loaded while the C path was ruled out): no plain weights
                return None
            first = self.model.layers[0]
            geometry = (first.num_heads, first.num_kv_heads, first.head_dim)
            vocab = self.lm_head[0].weight.shape[0]
            self._step = DenseStep.build(weights, geometry, self.model.norm.eps, vocab)
        return self._step

    def generate(
        self,
        talker_hidden: torch.Tensor,
        first_code_embeds: torch.Tensor,
        sample: Callable[[int, torch.Tensor], torch.Tensor],
        whole_frame: FrameDraws | None = None,
    ) -> torch.Tensor:
        """[B, H] talker hidden and first-code embeddings -> [B, G-1] codes; `sample(j,
        logits)` picks code j+1 of every row. `whole_frame`: how the same draws are made
        in C, so that the C path may take the whole frame in one call (`DenseStep.frame`;
        its greedy rows' codes are `sample`'s, its sampled rows' are drawn by the same race
        from the same keys)."""
        x = torch.stack([talker_hidden, first_code_embeds], dim=1)
        step = self.dense_step()
        if step is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            if whole_frame is not None:
                tables = [e.weight for e in self.model.codec_embedding]  # no slice: a
                heads = [h.weight for h in self.lm_head]  # ModuleList's copies itself
                cache = step.new_cache(x.shape[0])
                return step.frame(x.contiguous(), cache, tables[:-1], heads, whole_frame)
            return self._generate_in_c(step, x, sample)
        x = self._project(x)
        caches: list[list[torch.Tensor]] = [[] for _ in self.model.layers]
        start, codes = 0, []
        for j in range(self.num_codes):
            t = x.shape[1]
            cos, sin = self.rotary.cos[start : start + t], self.rotary.sin[start : start + t]
            for layer, cache in zip(self.model.layers, caches, strict=True):
                x = layer(x, cos, sin, cache)
            start += t
            logits = self.lm_head[j](self.model.norm(x[:, -1])).float()
            code = sample(j, logits)
            codes.append(code)
            if j + 1 < self.num_codes:
                x = self._project(self.model.codec_embedding[j](code)[:, None])
        return torch.stack(codes, dim=1)

    def _generate_in_c(
        self, step: DenseStep, x: torch.Tensor, sample: Callable[[int, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """`generate` with each decoder step one C call (`dense_step`), the input rows'
        projection included."""
        cache = step.new_cache(x.shape[0])
        logits = step.run(x.contiguous(), 0, cache, self.lm_head[0].weight)
        codes = [sample(0, logits)]
        for j in range(1, self.num_codes):  # the code just drawn, looked up inside the step
            drawn = codes[-1].long().contiguous()
            table = self.model.codec_embedding[j - 1].weight
            start = x.shape[1] + j - 1
            logits = step.run_codes(drawn, table, start, cache, self.lm_head[j].weight)
            codes.append(sample(j, logits))
        return torch.stack(codes, dim=1)


class CodePredictingTalker:
    """Mixin for a talker decoder class (a `CausalLM` whose input embedding is the codec
    embedding and head the codec head): call `init_talker` at the end of `__init__`."""

    prefer_model_sampler = True
    codes_feed_back_by_row = True  # embedding lookups and their sum
    code_predictor_params: ClassVar[SamplingParams]
    """How codes 1..G-1 of a sampled (not greedy) request are drawn."""

    def init_talker(self, code_predictor: CodePredictor, vocab_size: int, eos_id: int) -> None:
        self.codec_eos_token_id = eos_id
        self.code_predictor = code_predictor
        self.num_token_codes = code_predictor.num_codes
        suppressed = torch.zeros(vocab_size, dtype=torch.bool)
        suppressed[vocab_size - NUM_SUPPRESSED :] = True
        suppressed[eos_id] = False
        self.register_buffer("suppressed", suppressed, persistent=False)
        self._sampler = Sampler()
        self._sampling_hidden: torch.Tensor | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sampling_hidden = hidden  # read by sample(), which the runner calls next
        return super().compute_logits(hidden)  # type: ignore[misc]

    def embed_token_codes(self, codes: torch.Tensor) -> torch.Tensor:
        return self.code_predictor.embed(codes)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        hidden, self._sampling_hidden = self._sampling_hidden, None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError(f"{type(self).__name__}.sample: compute_logits was not called first")
        logits = logits.masked_fill(self.suppressed.to(logits.device), float("-inf"))
        first = self._sampler(logits, metadata)
        residual_md = code_predictor_metadata(
            metadata, self.num_token_codes, logits.device, self.code_predictor_params
        )
        residual = self.code_predictor.generate(
            hidden,
            self.embed_tokens(first),  # type: ignore[attr-defined]
            lambda j, lg: self._sampler(lg, residual_md[j]),
            whole_frame=frame_draws(residual_md[0], metadata.output_positions),
        )
        return torch.cat([first[:, None], residual], dim=1)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        own: dict[str, torch.Tensor] = {}

        def decoder(items: Iterable[tuple[str, torch.Tensor]]):
            for name, tensor in items:
                if name.startswith("code_predictor."):
                    own[name.removeprefix("code_predictor.")] = tensor
                else:
                    yield name, tensor

        loaded = super().load_weights(decoder(weights))  # type: ignore[misc]
        for name, tensor in own.items():
            self.code_predictor.load(name, tensor.to(self.dtype))  # type: ignore[attr-defined]
            loaded.add(f"code_predictor.{name}")
        return loaded

    def expected_weight_names(self) -> set[str]:
        names = {n for n in super().expected_weight_names() if "code_predictor." not in n}  # type: ignore[misc]
        return names | {f"code_predictor.{n}" for n in self.code_predictor.checkpoint_names()}
