"""`KVContext`: the keys and values of a prefilled sequence that denoising steps attend to.

Bagel's image tokens attend to everything before them (the prompt, and in the
reference's interleaved chats earlier images), through a KV cache the
understanding expert filled. A request with classifier-free guidance has several
such contexts (the prompt's; the one without the text), each with its own
length and its own next RoPE position (`rope`). The image tokens all sit at one
position: `rope`, the prefill's real length — never a count that includes
tokens scheduled but not computed (seeds/002's ~7,600 vs ~10 position shift).

Across stages a context travels as rows: one row per token, every layer's key
then value, flattened (`to_rows` / `from_rows`), so the connector's per-position
payload machinery carries it, and a consumer takes exactly the first `length`
rows the producer confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVContext:
    keys: list[torch.Tensor]
    """Per layer `[length, kv_heads, head_dim]`, RoPE applied."""
    values: list[torch.Tensor]
    """Per layer `[length, kv_heads, head_dim]`."""
    rope: int
    """The RoPE position of the next token (the reference's `ropes`)."""

    @property
    def length(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @classmethod
    def empty(cls, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> KVContext:
        """No tokens yet (the reference's `init_gen_context`)."""
        blank = torch.zeros(0, kv_heads, head_dim, dtype=dtype)
        return cls([blank] * num_layers, [blank] * num_layers, rope=0)

    def extended(
        self, keys: list[torch.Tensor], values: list[torch.Tensor], rope: int | None = None
    ) -> KVContext:
        """This context followed by new tokens; `rope` the next position (default: the new
        tokens at consecutive positions; an image block takes one position for all)."""
        count = keys[0].shape[0]
        return KVContext(
            [torch.cat([a, b]) for a, b in zip(self.keys, keys, strict=True)],
            [torch.cat([a, b]) for a, b in zip(self.values, values, strict=True)],
            rope=self.rope + count if rope is None else rope,
        )

    def to_rows(self) -> torch.Tensor:
        """`[length, layers * 2 * kv_heads * head_dim]`: per token, layer by layer, key then value."""
        per_layer = [torch.cat([k, v], dim=1) for k, v in zip(self.keys, self.values, strict=True)]
        return torch.stack(per_layer, dim=1).reshape(self.length, -1)


def from_rows(rows: torch.Tensor, num_layers: int, kv_heads: int, head_dim: int) -> KVContext:
    """The context whose `to_rows` is `rows` (its tokens at positions 0 .. len - 1)."""
    width = num_layers * 2 * kv_heads * head_dim
    if rows.ndim != 2 or rows.shape[1] != width:
        raise ValueError(
            f"kv rows: expected [tokens, {width}] ({num_layers} layers x key and value x "
            f"{kv_heads} heads x {head_dim}), got {list(rows.shape)}"
        )
    grid = rows.reshape(rows.shape[0], num_layers, 2 * kv_heads, head_dim)
    keys = [grid[:, i, :kv_heads] for i in range(num_layers)]
    values = [grid[:, i, kv_heads:] for i in range(num_layers)]
    return KVContext(keys, values, rope=rows.shape[0])
