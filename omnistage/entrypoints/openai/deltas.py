"""What changed in a request since it was last reported: text, tokens, logprobs.

`LLMEngine.step` hands back each request's cumulative `RequestOutput`, and keeps
mutating it on the engine thread. `DeltaTracker` (used on that thread) turns it
into immutable `RequestDelta`s that can cross to the event loop safely.

Stop strings: the engine cuts the text back to just before a stop string once
it has matched, so text that might be the start of one is held back (the
longest stop string minus one character) until more text or the end shows it is
not. The streamed pieces therefore always add up to the final text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.outputs import Logprob, RequestOutput
from omnistage.sampling_params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token: its text, bytes and logprob, and the top-N alternatives."""

    token_id: int
    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]
    """(text, bytes, logprob) of the most likely tokens, best first."""


@dataclass(frozen=True)
class SequenceDelta:
    """New output of one sample (`index`) of a request."""

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
    finish_reason: str | None = None
    """"stop", "length" or "abort"; None while the sample runs."""
    stop_reason: int | str | None = None


@dataclass(frozen=True)
class RequestDelta:
    """What a step changed in a request; `finished` on its last one."""

    request_id: str
    sequences: list[SequenceDelta]
    finished: bool
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    audio: Any = None
    """New audio samples (float, mono) of a speaking pipeline's audio stage, if any."""
    image: Any = None
    """A drawing pipeline's image (`[H, W, 3]` uint8), on the last delta where asked for."""


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenTexts:
    """Text and bytes of single tokens (for logprobs), cached per token id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._byte_of = _byte_level_alphabet()

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            text = self._tokenizer.decode([token_id])
            piece = self._tokenizer.convert_ids_to_tokens(token_id) or ""
            if piece and all(ch in self._byte_of for ch in piece):  # byte-level BPE
                raw = [self._byte_of[ch] for ch in piece]
            else:
                raw = list(text.encode("utf-8"))
            hit = self._cache[token_id] = (text, raw)
        return hit


@dataclass
class _Sent:
    text: int = 0
    tokens: int = 0
    logprobs: int = 0
    finished: bool = False


@dataclass
class DeltaTracker:
    """Per request: how much of each sample was already reported."""

    request_id: str
    params: SamplingParams
    token_texts: TokenTexts
    _sent: dict[int, _Sent] = field(default_factory=dict)

    def update(self, output: RequestOutput) -> RequestDelta | None:
        """The delta since the last call, or None when nothing reportable changed."""
        holdback = max((len(s) for s in self.params.stop_strings), default=1) - 1
        deltas = []
        for comp in output.outputs:
            sent = self._sent.setdefault(comp.index, _Sent())
            if sent.finished:
                continue
            end = len(comp.text) if comp.finished else max(sent.text, len(comp.text) - holdback)
            delta = SequenceDelta(
                index=comp.index,
                text=comp.text[sent.text : end],
                token_ids=list(comp.token_ids[sent.tokens :]),
                logprobs=self._logprobs(comp.token_ids, comp.logprobs, sent.logprobs),
                finish_reason=comp.finish_reason,
                stop_reason=comp.stop_reason,
            )
            sent.text, sent.tokens, sent.finished = end, len(comp.token_ids), comp.finished
            sent.logprobs = len(comp.logprobs) if comp.logprobs is not None else 0
            if delta.text or delta.token_ids or delta.finish_reason:
                deltas.append(delta)
        if not deltas and not output.finished:
            return None
        return RequestDelta(
            request_id=self.request_id,
            sequences=deltas,
            finished=output.finished,
            num_prompt_tokens=len(output.prompt_token_ids),
            num_cached_tokens=output.num_cached_tokens,
        )

    def aborted(self, num_prompt_tokens: int) -> RequestDelta:
        """The last delta of a request the server aborted: each running sample ends "abort"."""
        sequences = [
            SequenceDelta(index=i, text="", token_ids=[], logprobs=None, finish_reason="abort")
            for i in range(self.params.n)
            if not self._sent.get(i, _Sent()).finished
        ]
        return RequestDelta(self.request_id, sequences, True, num_prompt_tokens)

    def _logprobs(
        self, token_ids: list[int], logprobs: list[dict[int, Logprob]] | None, start: int
    ) -> list[TokenLogprob] | None:
        if logprobs is None:
            return None
        top_n = self.params.logprobs or 0
        out = []
        for token_id, entry in zip(token_ids[start:], logprobs[start:], strict=False):
            text, raw = self.token_texts(token_id)
            ranked = sorted(entry.items(), key=lambda item: item[1].rank)[:top_n]
            top = [(*self.token_texts(tid), lp.logprob) for tid, lp in ranked]
            out.append(TokenLogprob(token_id, text, raw, entry[token_id].logprob, top))
        return out
