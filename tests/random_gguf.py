"""`python -m tests.random_gguf OUT.gguf [--arch qwen3] [--type Q4_1]`: a random-weight model
of SmolLM2-135M's sizes, written as llama.cpp's converter writes it (the writer of
`tests/test_loading.py`), for benchmarks of an architecture that has no small checkpoint on
this machine (docs/performance.md, "One C call per decode step": a Qwen3 decode step).

The token list is padded to the vocabulary (the byte-level tokens, one merge, the two
control tokens, then `tok<N>` fillers) so that llama.cpp loads the file too; products are
stored as `--type`, the tied embedding as Q8_0 (as in the built-in model's Q4_1 file),
norms as F32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
from gguf import GGMLQuantizationType as Q
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests import test_loading

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=2048,
    rope_theta=100000.0,
)
PRODUCTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _padded_tokenizer(vocab_size: int):
    """`test_loading._add_tokenizer` with `vocab_size` tokens."""

    def add(w: gguf.GGUFWriter) -> None:
        alphabet = bytes_to_unicode()
        tokens = [alphabet[b] for b in range(256)] + ["he", *test_loading._SPECIALS]
        fillers = [f"tok{i}" for i in range(vocab_size - len(tokens))]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens + fillers)
        types = [gguf.TokenType.NORMAL] * 257 + [gguf.TokenType.CONTROL] * 2
        w.add_token_types(types + [gguf.TokenType.NORMAL] * len(fillers))
        w.add_token_merges(["h e"])
        w.add_bos_token_id(257)
        w.add_eos_token_id(258)
        w.add_pad_token_id(258)
        w.add_add_bos_token(False)
        w.add_chat_template(test_loading._CHAT_TEMPLATE)

    return add


def write(path: Path, arch: str, product_type: Q) -> None:
    sizes = dict(SMOLLM2_135M)
    if arch != "qwen3":
        sizes.pop("head_dim")
    model = test_loading.tiny_model(arch, tied=True, **sizes)
    layers = model.config.num_hidden_layers
    types = {f"blk.{i}.{p}.weight": product_type for i in range(layers) for p in PRODUCTS}
    test_loading._add_tokenizer = _padded_tokenizer(model.config.vocab_size)
    test_loading.write_gguf(path, model, arch, {"token_embd.weight": Q.Q8_0, **types})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arch", default="qwen3", choices=["llama", "qwen2", "qwen3"])
    parser.add_argument("--type", default="Q4_1", choices=["Q4_0", "Q4_1", "Q8_0"])
    args = parser.parse_args()
    write(args.out, args.arch, Q[args.type])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
