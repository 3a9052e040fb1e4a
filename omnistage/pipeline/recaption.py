"""Think -> recaption: splitting a thinker's output into its thought and its caption.

A thinker of this kind writes `<think> thought </think><recaption> caption
</recaption>` (the stage-transition processor forces `<recaption>` right after
`</think>` and the end right after `</recaption>`). `split_thought` reads the
token ids with the thinker's own tokenizer, so it works whatever the request's
`skip_special_tokens` was: the caption is the text between the first
`<recaption>` and the next `</recaption>`, the thought the text before
`</think>`, each decoded without special tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

THINK_END = "</think>"
RECAPTION = "<recaption>"
RECAPTION_END = "</recaption>"


@dataclass(frozen=True)
class ThoughtAndCaption:
    thought: str
    caption: str | None
    """None when the thinker wrote no complete `<recaption> ... </recaption>`."""


@functools.lru_cache(maxsize=8)
def _tokenizer(model: str) -> Any:
    from omnistage.models.loader import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model(model))


def _token_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ValueError(f"recaption: {token!r} is not a token of the thinker's vocabulary")
    return int(token_id)


def split_thought(model: str, token_ids: list[int]) -> ThoughtAndCaption:
    """The thought and caption of a thinker's output tokens (`model`: its checkpoint)."""
    tokenizer = _tokenizer(model)
    think_end = _token_id(tokenizer, THINK_END)
    start, end = _token_id(tokenizer, RECAPTION), _token_id(tokenizer, RECAPTION_END)

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True).strip()

    thought_end = token_ids.index(think_end) if think_end in token_ids else len(token_ids)
    caption = None
    if start in token_ids:
        begin = token_ids.index(start) + 1
        if end in token_ids[begin:]:
            caption = text(token_ids[begin : token_ids.index(end, begin)])
    return ThoughtAndCaption(text(token_ids[:thought_end]), caption)


def caption_of(upstream: Any) -> str:
    """The caption of an `UpstreamResult`; ValueError when there is none to draw."""
    if upstream.producer_model is None:
        raise ValueError("recaption_to_prompt: the producer's checkpoint is unknown")
    caption = split_thought(upstream.producer_model, list(upstream.output_token_ids)).caption
    if caption is None:
        raise ValueError(
            "recaption_to_prompt: the thinker wrote no caption (no <recaption> ... "
            "</recaption> in its output; raise its max_tokens or check its stage transitions)"
        )
    if not caption:
        raise ValueError("recaption_to_prompt: the thinker's caption is empty")
    return caption
