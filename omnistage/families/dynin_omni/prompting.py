"""Dynin-Omni's prompt templates for speech (what `UniversalPrompting(...)((texts,
audio_tokens), "t2s_gen")` builds in the reference, with vLLM-Omni's chat wrapping of the
text): the user's text inside Dynin's chat headers after an instruction, tokenized, then

    [iPAD] ... [iPAD] <|t2s|> <bos> text <eos> <|soa|> [mask] * n

left-padded with `[iPAD]` to `max_text_len + 1` positions (or cut to that length, ending in
<eos>), and the attention mask that hides the padding (LLaDA's attention bias keeps a
query/key pair only where both are unmasked).
"""

from __future__ import annotations

import torch

USER, ASSISTANT = (
    "<|start_header_id|>user<|end_header_id|>\n",
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n",
)


def t2s_chat_text(text: str, instruction: str) -> str:
    """vLLM-Omni's `build_t2s_chat_prompt`."""
    return f"{USER}{instruction}\n{text}{ASSISTANT}"


def t2s_gen_prompt(
    text_ids: list[int],
    n_units: int,
    *,
    task_id: int,
    bos_id: int,
    eos_id: int,
    soa_id: int,
    pad_id: int,
    mask_id: int,
    max_text_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of one speech request (`UniversalPrompting.t2s_gen_prompt`,
    whose length is `max_text_len + 1`: the reference's constructor adds one)."""
    limit = max_text_len + 1
    if not text_ids or text_ids[0] != bos_id:
        text_ids = [bos_id, *text_ids]
    ids = [task_id, *text_ids, eos_id]
    if len(ids) <= limit:
        pad = limit - len(ids)
        ids = [pad_id] * pad + ids
        mask = [0] * pad + [1] * (limit - pad + n_units + 1)
    else:
        ids = ids[: limit - 1] + [eos_id]
        mask = [1] * (limit + n_units + 1)
    seq = torch.tensor([*ids, soa_id, *([mask_id] * n_units)], dtype=torch.long)
    return seq, torch.tensor(mask, dtype=torch.long)
