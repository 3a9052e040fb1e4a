"""Dynin-Omni's prompt templates: the chat layout of its text ("mmu") prompts, and the
generation templates (what `UniversalPrompting(...)((texts, tokens),
"t2s_gen" / "t2i_gen")` builds in the reference; for speech, vLLM-Omni first wraps the text
in Dynin's chat headers after an instruction):

    [iPAD] ... [iPAD] <|t2s|> <bos> text <eos> <|soa|> [mask] * n
    [iPAD] ... [iPAD] <|t2i|> <bos> text <eos> <|soi|> [mask] * n <|eoi|>

the text part left-padded with `[iPAD]` to `max_text_len + 1` positions (or cut to that
length, ending in <eos>), and the attention mask that hides the padding (LLaDA's attention
bias keeps a query/key pair only where both are unmasked). An image request's guidance
prompt is the same template with an empty text.

Text requests are chats in the checkpoint tokenizer's own template (vLLM-Omni's Dynin `t2t`
example renders `apply_chat_template(..., add_generation_prompt=True)` and runs
`mmu_generate` on those ids); `DYNIN_CHAT_TEMPLATE` is Dynin's layout for a checkpoint
without one (the tiny checkpoints). An image or speech request that arrives as such a chat
is reduced to its user text first, as vLLM-Omni's online path does (`chat_user_text`).
"""

from __future__ import annotations

import torch

USER, ASSISTANT = (
    "<|start_header_id|>user<|end_header_id|>\n",
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n",
)


DYNIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{% endif %}"
)
"""Dynin's chat layout as its prompt builders write it (vLLM-Omni's `build_dynin_chat_prompt`,
the i2t example's `build_i2t_chat_prompt`: one newline after each header), after <bos>; of a
message with content parts, the text parts (an image goes before the chat: `image_input`)."""
ASSISTANT_HEADER = "<|start_header_id|>assistant<|end_header_id|>"


def chat_user_text(decoded: str) -> str:
    """The user text of a decoded chat prompt, whitespace collapsed: vLLM-Omni's
    `extract_dynin_user_prompt_text` and `normalize_dynin_online_prompt_text` (the part
    before the last assistant header and <|eot_id|>, after the last user header)."""
    text = decoded
    for marker, keep in ((ASSISTANT_HEADER, 0), ("<|eot_id|>", 0)):
        if marker in text:
            text = text.rsplit(marker, 1)[keep]
    user = "<|start_header_id|>user<|end_header_id|>"
    if user in text:
        text = text.rsplit(user, 1)[-1]
    if "<|end_header_id|>" in text:
        text = text.split("<|end_header_id|>", 1)[-1]
    return " ".join((text.strip() or decoded).split())


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
