"""Incremental detokenization and stop strings, per sequence.

Text grows token by token through the tokenizers library's `DecodeStream`
(which holds back partial UTF-8 sequences). After each token the tail of the
text is searched for the request's stop strings; on a match the text is cut
before the stop string (or after it, with `include_stop_str_in_output`) and
the sequence is reported stopped. A sequence that ends otherwise (length, EOS) ends
with the text of all its tokens decoded at once (`finish`): bytes the stream held back
waiting for the rest of a character appear as that decode shows them.
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream

_PRIME_TOKENS = 4


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool,
        stop: list[str],
        include_stop_str_in_output: bool,
    ) -> None:
        self.text = ""
        self.stop = stop
        self.include_stop = include_stop_str_in_output
        self.stop_reason: str | None = None
        self._backend = getattr(tokenizer, "_tokenizer", None)
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []
        if self._backend is not None:
            self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
            # Prime with the prompt's tail so the first token decodes with its real context
            # (leading spaces of SentencePiece-style decoders).
            for token in prompt_token_ids[-_PRIME_TOKENS:]:
                self._stream.step(self._backend, token)

    def decode_token(self, token_id: int) -> str:
        """Text of one token on its own (for logprobs)."""
        return self._tokenizer.convert_ids_to_tokens(token_id) or ""

    def add_tokens(self, token_ids: list[int]) -> int | None:
        """Append tokens; when a stop string ends the sequence, returns how many of them
        were taken (the one completing the stop string last; later ones are dropped —
        several arrive at once with speculative decoding), else None."""
        for taken, token in enumerate(token_ids, start=1):
            before = len(self.text)
            self.text += self._step(token)
            if self.stop and self._check_stop(before):
                return taken
        return None

    def finish(self) -> None:
        """The sequence ended (not at a stop string): the text becomes the decode of all its
        tokens where that extends the text so far (a partial character the stream held
        back; else the text stays)."""
        if self.stop_reason is not None or not self._ids:
            return
        full = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special)
        if len(full) > len(self.text) and full.startswith(self.text):
            self.text = full

    def _step(self, token: int) -> str:
        self._ids.append(token)
        if self._backend is not None:
            return self._stream.step(self._backend, token) or ""
        full = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special)
        new = full[len(self.text) :] if full.startswith(self.text) else ""
        return new if not new.endswith("\ufffd") else ""

    def _check_stop(self, new_from: int) -> bool:
        longest = max(len(s) for s in self.stop)
        search_from = max(0, new_from - longest + 1)
        best: tuple[int, str] | None = None
        for stop in self.stop:
            idx = self.text.find(stop, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return False
        idx, stop = best
        self.text = self.text[: idx + len(stop)] if self.include_stop else self.text[:idx]
        self.stop_reason = stop
        return True
