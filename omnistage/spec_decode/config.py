"""`SpeculativeConfig`: how a stage speculates, parsed from vLLM's `speculative_config` dict.

    {"method": "ngram", "num_speculative_tokens": 4,
     "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    {"method": "draft_model", "model": "path/or/builtin", "num_speculative_tokens": 3}
    {"method": "mtp", "num_speculative_tokens": 1}

Every value is checked here, naming the field, so a bad config fails before
any model loads. The engine keeps the dict (it travels to a runner process as
it is) and parses it where it is used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model", "mtp")
_FIELDS = {
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "draft_dtype",
}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    """ngram (prompt lookup), draft_model (a smaller model of the same tokenizer) or mtp
    (the checkpoint's own multi-token-prediction layers)."""

    num_speculative_tokens: int
    """Draft tokens proposed per step for each request (k); one step verifies k + 1."""

    prompt_lookup_min: int = 2
    """ngram: shortest suffix of the history looked up in it."""

    prompt_lookup_max: int = 5
    """ngram: longest suffix looked up (longer matches are tried first)."""

    model: str | None = None
    """draft_model: the draft checkpoint (a built-in name, a directory or a .gguf)."""

    draft_dtype: str | None = None
    """draft_model: its dtype (default: the target's)."""

    @classmethod
    def parse(
        cls, value: dict[str, Any] | str | SpeculativeConfig | None
    ) -> SpeculativeConfig | None:
        """A config from a dict, a JSON string (the CLI's `--speculative-config`) or None."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"speculative_config: not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(
                "speculative_config: expected a dict such as "
                '{"method": "ngram", "num_speculative_tokens": 4}'
            )
        unknown = sorted(set(value) - _FIELDS)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown field(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(_FIELDS))}"
            )
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(
                f"speculative_config.method: expected one of {', '.join(METHODS)}, got {method!r}"
            )
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config.num_speculative_tokens: required")
        config = cls(**value)
        config._check()
        return config

    def _check(self) -> None:
        _positive_int("num_speculative_tokens", self.num_speculative_tokens, upper=16)
        _positive_int("prompt_lookup_min", self.prompt_lookup_min)
        _positive_int("prompt_lookup_max", self.prompt_lookup_max)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "speculative_config.prompt_lookup_min: must be <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} > {self.prompt_lookup_max}"
            )
        if self.method == "draft_model" and not (isinstance(self.model, str) and self.model):
            raise ValueError("speculative_config.model: draft_model needs the draft checkpoint")
        if self.method != "draft_model" and self.model is not None:
            raise ValueError(
                f"speculative_config.model: only draft_model takes one, not {self.method}"
            )

    @property
    def num_lookahead_slots(self) -> int:
        """KV slots a request needs past the verified ones: a draft model writes its own
        drafts' keys ahead of the target (k positions), MTP its draft passes' (k - 1)."""
        if self.method == "draft_model":
            return self.num_speculative_tokens
        return self.num_speculative_tokens - 1 if self.method == "mtp" else 0


def _positive_int(name: str, value: object, upper: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"speculative_config.{name}: must be a positive integer, got {value!r}")
    if upper is not None and value > upper:
        raise ValueError(f"speculative_config.{name}: must be <= {upper}, got {value}")
