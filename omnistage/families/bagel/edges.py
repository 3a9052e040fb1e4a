"""`BagelPromptKV`: the understanding stage's prompt KV cache, handed to the denoising stage.

The producer collects, per request, its prompt ids and one KV row per position it
computed for good (`understanding.BagelUnderstanding.stage_hidden_states`); the consumer
gets exactly the prompt's rows — the confirmed tokens' KV and nothing a step scheduled
ahead wrote. The rows travel in the `hidden_states.output` payload key (one row per
position, as hidden states do) through the edge's connector (shared memory in one
machine); the denoising stage turns them into a `KVContext` whose next RoPE position is
their count: the prefill's real length.

They reach the denoising model as the `prior_token_ids` of its `DiffusionInput` (the
diffusion stage's one slot for what an upstream AR stage conditions on; for Bagel it
holds float KV rows, not token ids).
"""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import Accumulate, EdgeProcessor
from omnistage.core.payload import Payload

KV_KEY = "hidden_states.output"


class BagelPromptKV(EdgeProcessor):
    name = "bagel_prompt_kv"

    accumulate = {"ids.prompt": Accumulate.REPLACE, KV_KEY: Accumulate.CONCAT}

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        """The KV rows of the prompt's positions (`[prompt tokens, row width]`)."""
        rows, prompt = payload.get(KV_KEY), payload.get("ids.prompt")
        if rows is None or prompt is None:
            raise ValueError(f"{self.name}: the payload lacks the prompt's ids or KV rows")
        if rows.shape[0] < prompt.shape[0]:
            raise ValueError(
                f"{self.name}: {rows.shape[0]} KV rows for a prompt of {prompt.shape[0]} tokens"
            )
        return rows[: prompt.shape[0]]
