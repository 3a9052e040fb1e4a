"""A sequence that ends in the middle of a character (a byte-level tokenizer's piece of a
multi-byte UTF-8 sequence) ends with the text of all its tokens decoded at once, as
`tokenizer.decode` shows it; one cut by a stop string keeps the cut."""

from __future__ import annotations

from transformers import AutoTokenizer

from omnistage.engine.detokenizer import IncrementalDetokenizer


def _partial_character(tokenizer) -> list[int]:
    """Tokens of some text whose last token ends inside a character."""
    for text in ("ab 😀", "x 𝄞", "été 中文字"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        for n in range(1, len(ids)):
            if tokenizer.decode(ids[:n]).endswith("\ufffd"):
                return ids[:n]
    raise AssertionError("no token of these texts ends inside a character")


def test_the_last_held_back_bytes_appear_when_the_sequence_ends(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    ids = _partial_character(tokenizer)
    detok = IncrementalDetokenizer(tokenizer, [1, 2, 3], True, [], False)
    detok.add_tokens(ids)
    assert not detok.text.endswith("\ufffd")  # held back while more may come
    detok.finish()
    assert detok.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_stop_string_cut_is_kept_at_the_end(tiny_llama):
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    ids = tokenizer.encode("hello world and more", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [], True, ["world"], False)
    assert detok.add_tokens(ids) is not None
    cut = detok.text
    detok.finish()
    assert detok.text == cut == "hello "
