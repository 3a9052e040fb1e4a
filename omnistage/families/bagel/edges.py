"""`BagelPromptKV`: the understanding stage's prompt KV cache, handed to the denoising stage.

The producer collects, per request, its prompt ids, the ids it wrote and one KV row per
position it computed for good (`understanding.BagelUnderstanding.stage_hidden_states`); the
consumer gets exactly the rows of the prompt and of the written tokens but the last (which
is sampled, never computed) — the confirmed tokens' KV and nothing a step scheduled ahead
wrote. The draw stage uses the prompt's rows, and a thinking request's thinking rows too
(`thinking.py`). The rows travel in the `hidden_states.output` payload key (one row per
position, as hidden states do) through the edge's connector (shared memory in one
machine).

They reach the denoising model as the `kv_context` of its `DiffusionInput`: a
`BagelHandOff` of the rows and the prompt's ids, from which the model reads where the
input images' blocks end and which RoPE position follows (`layout`): a block takes
one position whatever its length, so the next position is not the row count when the
prompt holds images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.core.edge_processor import Accumulate, EdgeProcessor
from omnistage.core.payload import Payload

KV_KEY = "hidden_states.output"


@dataclass(frozen=True)
class BagelHandOff:
    """The prompt's KV rows (`[prompt tokens, row width]`) and ids."""

    rows: torch.Tensor
    prompt_ids: torch.Tensor
    output_ids: torch.Tensor | None = None
    """The tokens the stage wrote (a thinking request's thinking; else ignored)."""

    def layout(self, start_of_image: int, end_of_image: int) -> tuple[int, int]:
        """(rows of the image blocks, RoPE position after them): the prompt starts with
        `start_of_image … end_of_image` blocks (`image_prompt.py`), one position each."""
        ids = self.prompt_ids.tolist()
        blocks, at = 0, 0
        while at < len(ids) and ids[at] == start_of_image:
            try:
                at = ids.index(end_of_image, at) + 1
            except ValueError:
                raise ValueError("kv_context: an image block without its end marker") from None
            blocks += 1
        return at, blocks


class BagelPromptKV(EdgeProcessor):
    name = "bagel_prompt_kv"

    accumulate = {
        "ids.prompt": Accumulate.REPLACE,
        "ids.output": Accumulate.CONCAT,
        KV_KEY: Accumulate.CONCAT,
    }

    def to_diffusion_input(self, payload: Payload) -> dict[str, Any]:
        """`kv_context`: the KV rows of the prompt's positions and of the written tokens but
        the last (never computed), the prompt's ids and the written ones."""
        rows, prompt = payload.get(KV_KEY), payload.get("ids.prompt")
        output = payload.get("ids.output")
        if rows is None or prompt is None:
            raise ValueError(f"{self.name}: the payload lacks the prompt's ids or KV rows")
        if rows.shape[0] < prompt.shape[0]:
            raise ValueError(
                f"{self.name}: {rows.shape[0]} KV rows for a prompt of {prompt.shape[0]} tokens"
            )
        written = 0 if output is None else max(output.shape[0] - 1, 0)
        rows = rows[: prompt.shape[0] + written]
        return {"kv_context": BagelHandOff(rows, prompt, output)}
