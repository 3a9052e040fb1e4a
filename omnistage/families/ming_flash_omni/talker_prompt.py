"""The talker's prompt: the text it speaks, laid out as the reference's
`prepare_input_embed` lays it out for the dense talker (inclusionAI/Ming-omni-tts
`modeling_bailingmm.py`), each part tokenized on its own as the reference does:

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n <|im_start|>user\\n
    {prompt} {speaker rows} " Text input:\\n" {text} <|im_end|>\\n <|im_start|>assistant\\n
    {instruction <|endoftext|>} <audio>

`prompt` is the task line ("Please generate speech based on the following
description.\\n", the reference cookbook's for speech). Without a speaker embedding there
is no speaker row (the reference's path without a prompt voice); speaker rows, an
instruction and a zero-shot voice prompt (prompt latents) are not built here.
The talker speaks the thinker's reply text alone (`edges.py`).
"""

from __future__ import annotations

from typing import Any

SPEECH_PROMPT = "Please generate speech based on the following description.\n"
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"


def talker_prompt_ids(tokenizer: Any, text: str, prompt: str = SPEECH_PROMPT) -> list[int]:
    """The talker's prompt ids for speaking `text` (ValueError when it is empty)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("input: the text to speak is empty")
    parts = [
        SYSTEM,
        "<|im_start|>user\n",
        prompt,
        " Text input:\n",
        text,
        "<|im_end|>\n",
        "<|im_start|>assistant\n",
        "<audio>",
    ]
    return [i for part in parts for i in tokenizer.encode(part)]
