"""llama.cpp's tensor names and layouts in a GGUF file, mapped to HF parameter names.

Shared by the converter (`gguf_loader`, which dequantizes) and the quantized
loader (`gguf_quantized`, which keeps the blocks); neither transformers nor
torch is imported here.
"""

from __future__ import annotations

import re

import numpy as np

ROPE_PERMUTED_ARCHITECTURES = frozenset({"llama"})
"""GGUF architectures whose q/k rows llama.cpp's converter reorders for its rope layout."""

ROPE_FREQS = "rope_freqs.weight"
"""llama3-style rope scaling as per-frequency factors (folded into the config)."""

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def hf_tensor_name(gguf_name: str) -> str | None:
    """HF parameter name of a llama.cpp tensor name, or None if it is not a known one."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES and suffix in ("weight", "bias"):
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    m = _BLOCK_RE.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    return None


def rope_heads(gguf_name: str, num_heads: int, num_kv_heads: int) -> int | None:
    """The head count whose rope layout a llama q/k tensor was permuted by (else None)."""
    kind = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
    return {"attn_q": num_heads, "attn_k": num_kv_heads}.get(kind)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`, on the rows of `w` (floats, or a quantized
    tensor's rows of blocks: a row's bytes move as a whole).

    Within each head, HF orders rotary rows as (2 halves, half) and llama.cpp as
    (half, 2 interleaved); this reads rows as (head, half, 2) and swaps back.
    """
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )
