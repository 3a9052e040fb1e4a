"""Dynin-Omni's generation prompt templates (what `UniversalPrompting(...)((texts, tokens),
"t2s_gen" / "t2i_gen")` builds in the reference; for speech, vLLM-Omni first wraps the text
in Dynin's chat headers after an instruction):

    [iPAD] ... [iPAD] <|t2s|> <bos> text <eos> <|soa|> [mask] * n
    [iPAD] ... [iPAD] <|t2i|> <bos> text <eos> <|soi|> [mask] * n <|eoi|>

the text part left-padded with `[iPAD]` to `max_text_len + 1` positions (or cut to that
length, ending in <eos>), and the attention mask that hides the padding (LLaDA's attention
bias keeps a query/key pair only where both are unmasked). An image request's guidance
prompt is the same template with an empty text.
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


def _padded_text(
    text_ids: list[int], task_id: int, bos_id: int, eos_id: int, pad_id: int, limit: int
) -> tuple[list[int], int]:
    """`<task> <bos> text <eos>` left-padded to `limit` ids (or cut, ending in <eos>), and
    the number of padding ids."""
    if not text_ids or text_ids[0] != bos_id:
        text_ids = [bos_id, *text_ids]
    ids = [task_id, *text_ids, eos_id]
    if len(ids) <= limit:
        return [pad_id] * (limit - len(ids)) + ids, limit - len(ids)
    return ids[: limit - 1] + [eos_id], 0


def gen_prompt(
    text_ids: list[int],
    n_masks: int,
    *,
    task_id: int,
    bos_id: int,
    eos_id: int,
    start_id: int,
    end_id: int | None,
    pad_id: int,
    mask_id: int,
    max_text_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of `UniversalPrompting.t2s_gen_prompt` (`start_id` <|soa|>, no
    `end_id`) or `t2i_gen_prompt` (<|soi|> ... <|eoi|>): the text part is `max_text_len + 1`
    ids (the reference's constructor adds one), then the start, `n_masks` masks, the end."""
    ids, pad = _padded_text(text_ids, task_id, bos_id, eos_id, pad_id, max_text_len + 1)
    tail = [start_id, *([mask_id] * n_masks), *([] if end_id is None else [end_id])]
    mask = [0] * pad + [1] * (len(ids) - pad + len(tail))
    return torch.tensor([*ids, *tail], dtype=torch.long), torch.tensor(mask, dtype=torch.long)
