"""`SamplingParams`: what the user asks of one generation, validated up front.

Shaped like vLLM's so code moves over by changing an import. Every bad value
raises `ValueError` naming the field before any request reaches the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Sampling and stopping parameters of one request."""

    n: int = 1
    """Number of independent samples returned for the prompt."""

    temperature: float = 1.0
    """0 means greedy; higher flattens the distribution."""

    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""

    top_k: int = 0
    """Keep the k most likely tokens; 0 or -1 disables."""

    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the top token's."""

    presence_penalty: float = 0.0
    """Subtracted from the logit of every token already generated."""

    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was generated."""

    repetition_penalty: float = 1.0
    """Divides positive (multiplies negative) logits of tokens seen in prompt or output."""

    seed: int | None = None
    """Per-request seed: the output depends only on it, never on the rest of the batch."""

    max_tokens: int | None = 16
    """Most tokens to generate; None means up to the model's context length."""

    min_tokens: int = 0
    """EOS and stop tokens are masked until this many tokens were generated."""

    stop: str | list[str] | None = None
    """Strings that end the generation; the stop string is not part of the text."""

    stop_token_ids: list[int] | None = None
    """Token ids that end the generation (the token is kept in token_ids)."""

    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token."""

    logprobs: int | None = None
    """Return this many top log-probabilities per generated token (plus the sampled one)."""

    logit_bias: dict[int, float] | None = None
    """Added to the logits of the given token ids before sampling."""

    skip_special_tokens: bool = True
    """Leave special tokens out of the returned text."""

    include_stop_str_in_output: bool = False
    """Keep the matched stop string at the end of the text."""

    model_options: dict[str, object] | None = None
    """Options of the stage's own model, read by its prompter (Bagel's understanding stage:
    `think`); a model that takes none refuses any (ValueError naming `model_options`)."""

    _stop_list: list[str] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        _int_at_least("n", self.n, 1)
        _number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        _number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        _int_at_least("top_k", self.top_k, -1)
        _number("min_p", self.min_p)
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p: must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _number(name, value)
            if not -2 <= value <= 2:
                raise ValueError(f"{name}: must be in [-2, 2], got {value}")
        _number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty: must be > 0, got {self.repetition_penalty}")
        if self.seed is not None:
            _int_at_least("seed", self.seed, -(2**63))
        if self.max_tokens is not None:
            _int_at_least("max_tokens", self.max_tokens, 1)
        _int_at_least("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens: must be <= max_tokens, got {self.min_tokens} > {self.max_tokens}"
            )
        self._stop_list = _stop_strings(self.stop)
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, (list, tuple)):
                raise ValueError("stop_token_ids: must be a list of token ids")
            for token_id in self.stop_token_ids:
                _int_at_least("stop_token_ids", token_id, 0)
            self.stop_token_ids = list(self.stop_token_ids)
        if self.logprobs is not None:
            _int_at_least("logprobs", self.logprobs, 0)
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias: must be a dict of token id -> bias")
            clean: dict[int, float] = {}
            for key, bias in self.logit_bias.items():
                try:
                    token_id = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias: key {key!r} is not a token id") from None
                _number("logit_bias", bias)
                if not -100 <= bias <= 100:
                    raise ValueError(
                        f"logit_bias: bias for token {token_id} must be in [-100, 100]"
                    )
                clean[token_id] = float(bias)
            self.logit_bias = clean

        if self.model_options is not None and not isinstance(self.model_options, dict):
            raise ValueError("model_options: expected a mapping of option names to values")

    @property
    def stop_strings(self) -> list[str]:
        return self._stop_list

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def clone(self, **changes: object) -> SamplingParams:
        return dataclasses.replace(self, **changes)


def _stop_strings(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ValueError("stop: must be a string or a list of strings")
    if any(s == "" for s in items):
        raise ValueError("stop: stop strings must not be empty")
    return list(items)


def _number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    if value != value:  # NaN
        raise ValueError(f"{name}: must not be NaN")


def _int_at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name}: must be >= {low}, got {value}")
