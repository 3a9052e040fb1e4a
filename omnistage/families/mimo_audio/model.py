"""MiMo-Audio's fused LM: one Qwen2 decoder that writes text and speech in one sequence.

One LM position is one **group** of `group_size` audio frames (the reference's
`MiMoAudioForCausalLM`, `mimo_audio/modeling_mimo_audio.py`). Each step the decoder
samples one text token; when it is `<|empty|>` the position speaks: the **local
transformer** (the patch decoder, `local_forward` in the reference) writes the group's
`group_size x audio_channels` codes from the decoder's last hidden state, channel `c`
delayed by `delay_pattern[c]` steps, `group_size + max(delay)` small forwards with a
cache that lives for this position. Any other text token writes no speech: its codes
are the channels' empty ids (`speech_zeroemb_idx`, past every codebook).

So the runner keeps, with each output token, `num_token_codes = group_size *
audio_channels` codes, frame-major (`codes[g * C + c]`: frame g, channel c), i.e. the
reference's `[channels, group]` block flattened column-major. A position fed back is
embedded as the reference's `_prepare_input_embeds`: its text token's embedding (zero
for `<|empty|>`) plus, for a speaking position, the **patch encoder**: the sum of each
frame's channel embeddings (empty ids embed as zero; accumulated in bfloat16, as the
reference's buffer is), the input local transformer over the group's frames, and
`speech_group_downcast` of the group flattened. A position whose codes are all empty
ids (the prompt's text, a text token the LM wrote) gets no speech part, as the
reference's `is_speech` mask gives: the local transformer never samples an empty id.

Sampling: the text token with the request's parameters (the runner's processors
first); the codes greedy for greedy requests, else with `local_params` (the reference's
TTS local sampler: temperature 0.9, top-p 0.95), seeded by the request and (position,
code index), each channel's empty id never drawn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from omnistage.families.llama.model import Qwen2ForCausalLM
from omnistage.families.mimo_audio.config import (
    delays,
    input_local_config,
    local_config,
    speech_empty_ids,
    speech_vocab_sizes,
)
from omnistage.families.mimo_audio.local_transformer import LocalTransformer
from omnistage.families.qwen3_omni.code_draws import code_predictor_metadata
from omnistage.sample import Sampler, SamplingMetadata
from omnistage.sampling_params import SamplingParams

_OWN = (
    "local_transformer.",
    "input_local_transformer.",
    "local_transformer_lm_heads.",
    "speech_embeddings.",
    "speech_embeddings_to_local.",
    "speech_group_downcast.",
    "hidden_states_downcast.",
)
"""Checkpoint prefixes of the audio parts (the rest is the Qwen2 decoder and its head)."""


class AudioParts(nn.Module):
    """The LM's audio modules, by the checkpoint's names (one `nn.Module` so that they
    load as a state dict)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        local, inner = local_config(config), input_local_config(config)
        sizes, group = speech_vocab_sizes(config), config.group_size
        self.local_transformer = LocalTransformer(local)
        self.input_local_transformer = LocalTransformer(inner)
        self.local_transformer_lm_heads = nn.ModuleList(
            nn.Linear(local.hidden_size, n, bias=False) for n in sizes
        )
        self.speech_embeddings = nn.ModuleList(nn.Embedding(n, inner.hidden_size) for n in sizes)
        self.speech_embeddings_to_local = (
            nn.Linear(inner.hidden_size, local.hidden_size, bias=False)
            if inner.hidden_size != local.hidden_size
            else None
        )
        self.speech_group_downcast = nn.Linear(
            inner.hidden_size * group, config.hidden_size, bias=False
        )
        self.hidden_states_downcast = nn.Linear(config.hidden_size, local.hidden_size, bias=False)


def patch_encode(
    a: AudioParts, codes: torch.Tensor, empty: torch.Tensor, group: int, full_attention: bool
) -> torch.Tensor:
    """The patch encoder: [n, G*C] codes (frame-major; `empty` the [G*C] empty ids) ->
    [n, hidden] (zero where every code is empty), in the parts' dtype."""
    n = codes.shape[0]
    is_speech = (codes != empty).any(dim=1)
    frames = codes.view(n, group, -1)
    width = a.speech_embeddings[0].embedding_dim
    # The reference sums the channels into a bfloat16 buffer whatever the model's dtype.
    summed = torch.zeros(n, group, width, dtype=torch.bfloat16, device=codes.device)
    for c, table in enumerate(a.speech_embeddings):
        ids = frames[:, :, c]
        keep = ids != empty[c]
        summed += table(ids.clamp(0, table.num_embeddings - 1)) * keep[..., None]
    mask = is_speech[:, None, None]
    summed = summed * mask
    encoded = a.input_local_transformer(summed, causal=not full_attention)
    encoded = encoded * mask
    return a.speech_group_downcast(encoded.reshape(n, -1))


class MiMoAudioForCausalLM(Qwen2ForCausalLM):
    architectures = ("MiMoAudioForCausalLM", "MiMoAudioModel")
    prefer_model_sampler = True
    local_params = SamplingParams(temperature=0.9, top_p=0.95)
    """How a sampled (not greedy) request's codes are drawn."""

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, dtype, max_positions)
        if getattr(config, "empty_token_id", None) is None:
            raise ValueError(
                "empty_token_id: the config must name the <|empty|> text id (the id of "
                "<|empty|> in the checkpoint's tokenizer)"
            )
        self.empty_id = int(config.empty_token_id)
        self.group_size, self.channels = config.group_size, config.audio_channels
        self.delays = delays(config)
        self.num_token_codes = self.group_size * self.channels
        self.full_input_attention = bool(config.input_full_attention)
        self.audio = AudioParts(config).to(dtype).requires_grad_(False)
        self.register_buffer(
            "empty_codes",
            torch.tensor(speech_empty_ids(config) * self.group_size, dtype=torch.long),
            persistent=False,
        )
        self._sampler = Sampler()
        self._sampling_hidden: torch.Tensor | None = None

    # -- input side ----------------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        return embeds.masked_fill((input_ids == self.empty_id)[:, None], 0.0)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.embed_input_ids(input_ids)
        return super().forward(input_ids, positions, inputs_embeds)

    def embed_token_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, G*C] codes (frame-major) -> [n, hidden]: the patch encoder of each speaking
        position, zero for a position whose codes are all empty ids."""
        empty = self.empty_codes.to(codes.device)
        full = self.full_input_attention
        return patch_encode(self.audio, codes, empty, self.group_size, full).to(self.dtype)

    # -- output side ---------------------------------------------------------------------
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        self._sampling_hidden = hidden  # read by sample(), which the runner calls next
        return super().compute_logits(hidden)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        hidden, self._sampling_hidden = self._sampling_hidden, None
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            raise RuntimeError("MiMoAudioForCausalLM.sample: compute_logits was not called first")
        text = self._sampler(logits, metadata)
        codes = self.empty_codes.to(logits.device).repeat(text.shape[0], 1)
        speaking = (text == self.empty_id).nonzero().flatten()
        if speaking.numel():
            rows = speaking.tolist()
            md = code_predictor_metadata(
                _rows_of(metadata, rows), self.num_token_codes, logits.device, self.local_params
            )
            codes[speaking] = self.local_forward(hidden[speaking], md)
        return torch.cat([text[:, None], codes], dim=1)

    @torch.inference_mode()
    def local_forward(self, hidden: torch.Tensor, md: list[SamplingMetadata]) -> torch.Tensor:
        """[B, hidden] last hidden states -> [B, G*C] codes (frame-major); `md[j]` draws
        code j of every row."""
        a, g, ch = self.audio, self.group_size, self.channels
        b = hidden.shape[0]
        codes = torch.zeros(b, g, ch, dtype=torch.long, device=hidden.device)
        x = a.hidden_states_downcast(hidden)[:, None]
        cache = a.local_transformer.new_cache()
        for t in range(g + max(self.delays)):
            out = a.local_transformer(x, start=t, cache=cache)[:, -1]
            x = torch.zeros_like(x)
            for c, delay in enumerate(self.delays):
                if not delay <= t < delay + g:
                    continue
                logits = a.local_transformer_lm_heads[c](out).float()
                logits[:, self.empty_codes[c]] = float("-inf")
                token = self._sampler(logits, md[(t - delay) * ch + c])
                codes[:, t - delay, c] = token
                embed = a.speech_embeddings[c](token)
                if a.speech_embeddings_to_local is not None:
                    embed = a.speech_embeddings_to_local(embed)
                x = x + embed[:, None]
        return codes.view(b, g * ch)

    # -- weights -------------------------------------------------------------------------
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        own: dict[str, torch.Tensor] = {}

        def decoder(items: Iterable[tuple[str, torch.Tensor]]):
            for name, tensor in items:
                if name.startswith(_OWN):
                    own[name] = tensor
                elif ".rotary_emb." not in name:
                    yield name, tensor

        loaded = super().load_weights(decoder(weights))
        state = self.audio.state_dict()
        for name, tensor in own.items():
            if name not in state:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in the audio parts")
            if state[name].shape != tensor.shape:
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected "
                    f"{tuple(state[name].shape)}"
                )
            state[name].copy_(tensor.to(self.dtype))
            loaded.add(name)
        return loaded

    def expected_weight_names(self) -> set[str]:
        names = {n for n in super().expected_weight_names() if ".audio." not in f".{n}"}
        return names | set(self.audio.state_dict())


def _rows_of(md: SamplingMetadata, rows: list[int]) -> SamplingMetadata:
    """The per-request fields `code_predictor_metadata` reads, for a subset of rows."""
    return dataclasses.replace(
        md,
        sampling_params=[md.sampling_params[r] for r in rows],
        seeds=[md.seeds[r] for r in rows],
        output_positions=[md.output_positions[r] for r in rows],
    )
