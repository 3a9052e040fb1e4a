"""Mamba2 (`Mamba2ForCausalLM`): pre-norm residual blocks around `Mamba2Mixer`.

The model holds no attention layers: its per-request state is the mixers'
recurrent state (`families/mamba2/mixer.py`), bound by the runner through
`bind_recurrent_state`. Weights load from transformers' names under `backbone.`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from omnistage.families.mamba2.mixer import Mamba2Mixer
from omnistage.layers.linear import Embedding, Linear
from omnistage.layers.norm import RMSNorm
from omnistage.layers.recurrent_state import RecurrentLayerState
from omnistage.models.base import CausalLM


class Mamba2Block(nn.Module):
    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.layer_norm_epsilon, dtype)
        self.mixer = Mamba2Mixer(config, dtype)


class Mamba2ForCausalLM(CausalLM):
    """transformers' `Mamba2ForCausalLM` (HF names under `backbone.`)."""

    architectures = ("Mamba2ForCausalLM",)
    has_recurrent_state = True

    def __init__(self, config: Any, dtype: torch.dtype, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.embeddings = Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(
            Mamba2Block(config, dtype) for _ in range(config.num_hidden_layers)
        )
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon, dtype)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, False, dtype)
        if self.tie_word_embeddings:
            self.lm_head.weight = self.embeddings.weight
        # transformers keeps the residual stream in float32 (`residual_in_fp32`); never
        # below the model's own precision.
        self.residual_dtype = (
            torch.promote_types(dtype, torch.float32)
            if getattr(config, "residual_in_fp32", True)
            else dtype
        )
        self.num_layers = config.num_hidden_layers
        self.num_attention_layers = 0
        self.num_kv_heads = 0
        self.head_dim = 0

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        x = x.to(self.residual_dtype)
        for layer in self.layers:
            x = x + layer.mixer(layer.norm(x.to(self.dtype)))
        return self.norm_f(x).to(self.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def bind_kv_cache(self, kv_caches: list[torch.Tensor]) -> None:
        if kv_caches:
            raise ValueError(f"Mamba2 has no attention layers; got {len(kv_caches)} KV caches")

    def recurrent_state_shapes(self) -> list[tuple[tuple[int, ...], ...]]:
        return [layer.mixer.state_shapes() for layer in self.layers]

    def bind_recurrent_state(self, states: list[RecurrentLayerState]) -> None:
        if len(states) != len(self.layers):
            raise ValueError(
                f"Mamba2 has {len(self.layers)} recurrent layers; got {len(states)} states"
            )
        for layer, state in zip(self.layers, states, strict=True):
            layer.mixer.state = state

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = self._map_name(hf_name)
            if name is None:
                continue
            if name not in params:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has no parameter {name!r} in Mamba2ForCausalLM"
                )
            param = params[name]
            if tensor.shape != param.shape:
                raise ValueError(
                    f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, "
                    f"expected {tuple(param.shape)}"
                )
            param.copy_(tensor.to(self.dtype))
            loaded.add(name)
        return loaded

    def _map_name(self, hf_name: str) -> str | None:
        """HF name -> our parameter name (None: not loaded)."""
        name = hf_name.removeprefix("backbone.")
        if name == "embedding.weight":  # older checkpoints (transformers' load hook)
            name = "embeddings.weight"
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        return name

    def expected_weight_names(self) -> set[str]:
        """Keys `load_weights` must have set for the model to be complete."""
        return {name for name, _ in self.named_parameters()}
