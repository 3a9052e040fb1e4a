"""`CausalLM`: the interface every autoregressive model of omnistage implements.

The runner calls, per step, `forward(input_ids, positions)` inside a forward
context (attention layers read their metadata from it), then
`compute_logits(hidden)` on the rows that sample. A model may own its
sampling: set `prefer_model_sampler = True` and implement `sample()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn


@dataclass
class DeepstackRows:
    """The deepstack features of one step: after decoder layer `k` (`k < embeds.shape[0]`),
    `embeds[k]` is added to the hidden states of the step's flat token rows `rows`."""

    rows: torch.Tensor
    """[n] int64 flat token indices of the step (distinct)."""
    embeds: torch.Tensor
    """[num_layers_k, n, hidden]."""


class CausalLM(nn.Module):
    architectures: ClassVar[tuple[str, ...]] = ()
    """HF `architectures` names this class serves."""

    supports_mrope: ClassVar[bool] = False
    """`forward` takes [3, T] (T, H, W) rotary positions for steps that have 3-D positions."""

    supports_deepstack: ClassVar[bool] = False
    """`forward` takes `deepstack=DeepstackRows` for steps with deepstack features (the runner
    passes the keyword only then)."""

    token_modalities: ClassVar[tuple[str, ...]] = ()
    """The prompt-token modalities besides text a model tells apart (e.g. ("image", "audio"):
    codes 1, 2 of `MultimodalDecoderInputs.token_modality`); it reads a step's per-token codes
    from the forward context (`AttentionMetadata.token_modality`, None: all text)."""

    prefer_model_sampler: ClassVar[bool] = False
    """When True the runner calls `sample()` before the default sampler."""

    num_token_codes: int = 0
    """Extra codes a model samples with each token (e.g. a speech talker's residual
    codebooks). When > 0, `sample()` returns [rows, 1 + num_token_codes] (token, codes),
    the runner keeps the codes in the request's history, and a fed-back token's input
    embedding gets `embed_token_codes(codes)` added."""

    token_codes_are_floats: ClassVar[bool] = False
    """The "codes" are a float row per token (a continuous latent patch, Ming-flash-omni's
    talker): `sample()` returns a float tensor (the token in column 0, a whole number),
    the history keeps the row as Python floats (exact for float32 and float64), and
    `feed_back_codes` receives it in the model's dtype. Same path, same sync = async and
    recompute rules as integer codes."""

    codes_feed_back_by_row: ClassVar[bool] = False
    """`feed_back_codes` makes each row from that row alone with per-element ops (lookups,
    sums; no product whose result depends on how many rows share it), so one call over a
    step's fed-back rows of every request gives, bit for bit, what one call per request
    gives: the runner then makes one call a step instead of one per request."""

    hidden_output_layers: tuple[int, ...] = ()
    """Hidden states a stage sends downstream, as indices of transformers' `hidden_states`
    (0: the input embeddings, k: the output of layer k-1, num_layers: the final normed
    output), concatenated along the feature dim; empty: the final hidden state alone."""

    num_layers: int
    num_kv_heads: int
    head_dim: int

    has_recurrent_state: ClassVar[bool] = False
    """The model has recurrent layers (Mamba, gated delta-net) with per-request state slots
    (worker/recurrent.py): the runner keeps `RecurrentSlots`, the builder allocates the state
    of `recurrent_state_shapes()` and turns prefix caching off (a cached KV prefix cannot
    restore a recurrent state)."""

    @classmethod
    def reads_plain_config(cls, hf_config: Any) -> bool:
        """Whether the class reads `hf_config` only as attribute values (no transformers
        methods, no transformers module built from it), so that it can be served as a
        cached `PlainConfig` and a start imports no transformers (`plain_config.py`)."""
        return False

    @property
    def num_attention_layers(self) -> int:
        """How many KV cache tensors the builder allocates (one per full-attention layer, in
        layer order; `bind_kv_cache` receives exactly that many). Default: `num_layers`."""
        value = self.__dict__.get("_num_attention_layers")
        return self.num_layers if value is None else value

    @num_attention_layers.setter
    def num_attention_layers(self, value: int) -> None:
        self.__dict__["_num_attention_layers"] = int(value)

    def recurrent_state_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        """Per recurrent layer (in layer order), the per-slot shape of each of its state
        tensors; `[]` for a model without recurrent layers."""
        return []

    def bind_recurrent_state(self, states: list[Any]) -> None:
        """Give each recurrent layer its `RecurrentLayerState` (worker/recurrent.py), in the
        order of `recurrent_state_shapes()`."""
        if states:
            raise ValueError(f"{type(self).__name__} has no recurrent layers to bind state to")

    @classmethod
    def input_width_for(cls, config: Any) -> int:
        """Width of the rows a model of this class takes as input embeddings (prompt
        embeddings, conditioning rows) for `config`: its hidden size, unless the model
        projects wider inputs itself (Qwen2.5-Omni's talker takes the thinker's width).
        From the config alone, so an engine can check rows without the model at hand
        (its runner may live in another process)."""
        return int(config.hidden_size)

    @property
    def input_width(self) -> int:
        """`input_width_for(self.config)`."""
        return self.input_width_for(self.config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T] token ids and positions of the step -> [T, hidden] final hidden states.

        `inputs_embeds` ([T, input_width]), when given, replaces the token embeddings
        (a request whose prompt arrives as embeddings from another stage)."""
        raise NotImplementedError

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] token ids -> [T, hidden] input embeddings."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] float32 logits."""
        raise NotImplementedError

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors; returns the names of parameters that were set."""
        raise NotImplementedError

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        """Give each attention layer its cache tensor (see layers/attention.py)."""
        raise NotImplementedError

    def sample(self, logits: torch.Tensor, metadata: Any) -> torch.Tensor | None:
        """Model-owned sampling; None falls back to the default sampler."""
        return None

    def embed_token_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """[n, num_token_codes] codes -> [n, hidden], added to their tokens' embeddings."""
        raise NotImplementedError

    def feed_back_codes(self, token_embeds: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """The input embeddings [n, hidden] of n fed-back outputs from their tokens'
        embeddings and their codes [n, num_token_codes]; default: the sum with
        `embed_token_codes(codes)`. A model whose next input is made from the codes alone
        (Ming-flash-omni's talker: the aggregator of the latent patch) returns its own."""
        return token_embeds + self.embed_token_codes(codes)

    def stage_hidden_states(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rows a stage sends downstream for the step whose final hidden states are
        `hidden` (see `hidden_output_layers`)."""
        return hidden
