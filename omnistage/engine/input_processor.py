"""Turn user prompts into validated token ids and engine-core `Request`s.

Everything a user can get wrong is checked here and raised as `ValueError`
naming the problem, before any request reaches the engine core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.request import Request
from omnistage.sampling_params import SamplingParams

PromptType = str | Mapping[str, Any]

_MASK63 = (1 << 63) - 1


def child_seed(seed: int, index: int) -> int:
    """Seed of sample `index` of an n>1 request: sample 0 keeps the request's seed."""
    if index == 0:
        return seed
    return (seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9) & _MASK63


class InputProcessor:
    def __init__(
        self, tokenizer: Any, max_model_len: int, vocab_size: int, eos_token_id: int | None
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids) of a string or a {"prompt"|"prompt_token_ids"} dict."""
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, Mapping):
            if "prompt_token_ids" in prompt:
                text, ids = prompt.get("prompt"), prompt["prompt_token_ids"]
                if not isinstance(ids, (list, tuple)) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids
                ):
                    raise ValueError("prompt_token_ids: must be a list of integers")
                ids = list(ids)
            elif "prompt" in prompt and isinstance(prompt["prompt"], str):
                text, ids = prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
            else:
                raise ValueError("prompt: a dict prompt needs 'prompt' (str) or 'prompt_token_ids'")
        else:
            raise ValueError(f"prompt: expected a string or a dict, got {type(prompt).__name__}")
        self.validate_ids(ids)
        return text, ids

    def validate_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt: the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt: {len(ids)} tokens leave no room to generate within "
                f"max_model_len={self.max_model_len}"
            )
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(
                f"prompt_token_ids: token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )

    def check_params(self, params: SamplingParams) -> None:
        if params.model_options:  # a stage prompter that reads them takes them off first
            raise ValueError(
                f"model_options: this model takes no options (got {', '.join(params.model_options)})"
            )
        if params.logit_bias:
            bad = next((t for t in params.logit_bias if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"logit_bias: token id {bad} is outside the vocabulary")
        for t in params.stop_token_ids or ():
            if t >= self.vocab_size:
                raise ValueError(f"stop_token_ids: token id {t} is outside the vocabulary")

    def make_request(
        self,
        request_id: str,
        ids: list[int],
        params: SamplingParams,
        seed: int,
        prompt_embeds: torch.Tensor | None = None,
        stream_conditioning: bool = False,
        mm_decoder_inputs: MultimodalDecoderInputs | None = None,
    ) -> Request:
        room = self.max_model_len - len(ids)
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        return Request(
            request_id=request_id,
            prompt_token_ids=ids,
            sampling_params=params,
            eos_token_id=self.eos_token_id,
            max_tokens=max_tokens,
            sample_seed=seed,
            prompt_embeds=prompt_embeds,
            mm_decoder_inputs=mm_decoder_inputs,
            stream_conditioning=stream_conditioning,
        )

    def check_prompt_embeds(self, ids: list[int], embeds: torch.Tensor, hidden_size: int) -> None:
        if not isinstance(embeds, torch.Tensor) or not embeds.is_floating_point():
            raise ValueError("prompt_embeds: must be a floating-point torch.Tensor")
        if tuple(embeds.shape) != (len(ids), hidden_size):
            raise ValueError(
                f"prompt_embeds: expected shape ({len(ids)}, {hidden_size}) "
                f"(prompt tokens, hidden size), got {tuple(embeds.shape)}"
            )

    def check_mm_decoder_inputs(
        self,
        ids: list[int],
        inputs: MultimodalDecoderInputs,
        hidden_size: int,
        num_layers: int,
        supports_mrope: bool,
        supports_deepstack: bool,
        token_modalities: tuple[str, ...] = (),
    ) -> None:
        if not isinstance(inputs, MultimodalDecoderInputs):
            raise ValueError("mm_decoder_inputs: must be a MultimodalDecoderInputs")
        inputs.check(
            len(ids),
            hidden_size,
            self.max_model_len,
            num_layers,
            supports_mrope,
            supports_deepstack,
            token_modalities,
        )
