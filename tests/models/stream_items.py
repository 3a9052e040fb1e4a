"""A stream's `GenerationItem`s as the generation stage cuts them, and two checks of a
model's stream state (a stream's chunks in one call with another's decode in order; a
failed call leaves a stream as it was), for the streamed vocoders' tests (Qwen3-TTS and
Qwen3-Omni code2wav, Ming-flash-omni's audio VAE)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from omnistage.models.generation import GenerationItem


def stream_items(
    rows: torch.Tensor,
    chunks: list[int],
    *,
    prefix: int = 0,
    left_context: int = 0,
    lookahead: int = 0,
) -> list[GenerationItem]:
    """`rows` cut into chunks of `chunks` own rows after `prefix` rows of the producer's
    context: the first chunk starts with that prefix, each later one with up to
    `left_context` rows before it, each but the last with `lookahead` rows after it; the
    rows numbered as the stage numbers them; one state dict for the whole stream."""
    state: dict = {}
    items, start = [], prefix
    for n, size in enumerate(chunks):
        last = n == len(chunks) - 1
        context = prefix if n == 0 else min(start, left_context)
        ahead = 0 if last else lookahead
        items.append(
            GenerationItem(
                rows[start - context : start + size + ahead].clone(),
                context_len=context,
                lookahead_len=ahead,
                offset=start - context,
                state=state,
                last=last,
            )
        )
        start += size
    return items


def assert_two_chunks_in_one_call_decode_in_order(
    model: Any,
    items: Callable[[], list[GenerationItem]],
    other: list[GenerationItem],
) -> None:
    """`items()` cuts a fresh stream into three chunks, `other` another stream into two:
    the first two chunks of each, interleaved in one call, then the third, give each chunk
    the audio it has decoded one call at a time."""
    alone = [model.generate([item])[0] for item in items()]
    first, second, third = items()
    together = model.generate([first, other[0], second, other[1]]) + model.generate([third])
    picked = [together[0], together[2], together[4]]
    assert all(torch.equal(x, y) for x, y in zip(picked, alone, strict=True))


def assert_a_failed_call_leaves_the_stream(
    model: Any,
    monkeypatch: pytest.MonkeyPatch,
    owner: Any,
    name: str,
    items: Callable[[], list[GenerationItem]],
    after_running: bool = True,
) -> None:
    """`items()` cuts a fresh stream into three chunks. After the first, a call with the
    second and third whose second decode (`owner.name`) fails (`after_running`: once it
    ran, its caches grown) leaves the stream as the first left it: retried item by item,
    as the stage does, the chunks give the audio of the stream decoded alone."""
    expected = [model.generate([item])[0] for item in items()]
    first, second, third = items()
    model.generate([first])
    decode, calls = getattr(owner, name), []

    def failing_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2 and not after_running:
            raise RuntimeError("out of memory")
        out = decode(*args, **kwargs)
        if len(calls) == 2:
            raise RuntimeError("out of memory")
        return out

    monkeypatch.setattr(owner, name, failing_second)
    with pytest.raises(RuntimeError):
        model.generate([second, third])
    monkeypatch.setattr(owner, name, decode)
    retried = model.generate([second]) + model.generate([third])
    assert all(torch.equal(x, y) for x, y in zip(retried, expected[1:], strict=True))
