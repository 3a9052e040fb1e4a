"""Bagel's thinking before drawing (the reference's `interleave_inference(think=True)`).

With the per-request option `think` (`SamplingParams.model_options={"think": True}` for the
understanding stage) the context is, as the reference builds it for text-to-image:

    <|im_start|> GEN_THINK_SYSTEM_PROMPT <|im_end|> <|im_start|> prompt <|im_end|>
    <|im_start|> thinking <|im_end|>            then the image block

The understanding stage's prompt ends with the thinking's `<|im_start|>`; it writes the
thinking (greedy by default, as the reference's `do_sample=False`) up to `<|im_end|>` or
its `max_tokens` (default `MAX_THINK_TOKENS`). The KV hand-off carries the rows of every
position the stage computed for good: the prompt's and those of the thinking tokens but
the last one (a sampled token is never fed back; under async the step that would feed it
back is scheduled ahead, and its KV is dropped). The draw stage prefills what has no row
(the last thinking token unless it is `<|im_end|>`, then `<|im_end|>`) at the positions
that follow. Guidance contexts: without the text, the system block alone; without images,
the system and prompt blocks (no thinking): the reference's `cfg_text_context` and
`cfg_img_context`.

The reference decodes the thinking to text and prefills it re-tokenized; we keep the ids
the stage wrote, which is the same context where the text round-trips (the parity fixture
checks that it does). With `think` and an understanding request (text out) the system
prompt is the reference's `VLM_THINK_SYSTEM_PROMPT`. Thinking with input images is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from omnistage.families.bagel.context import from_rows

GEN_THINK_SYSTEM_PROMPT = (
    "You should first think about the planning process in the mind and then generate the "
    "image. \nThe planning process is enclosed within <think> </think> tags, i.e. <think> "
    "planning process here </think> image here"
)
VLM_THINK_SYSTEM_PROMPT = (
    "You should first think about the reasoning process in the mind and then provide the "
    "user with the answer. \nThe reasoning process is enclosed within <think> </think> "
    "tags, i.e. <think> reasoning process here </think> answer here"
)
"""The reference's system prompts (`inferencer.py`), word for word."""
MAX_THINK_TOKENS = 999
"""The reference's `max_think_token_n=1000` counts the start token."""
OPTIONS = ("think",)


def read_think(options: Mapping[str, Any] | None) -> bool:
    """The understanding stage's `model_options` checked: `think` (a bool, default False);
    ValueError naming an unknown option or a bad value."""
    options = options or {}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not an option of Bagel's understanding stage; known: "
            + ", ".join(OPTIONS)
        )
    think = options.get("think", False)
    if not isinstance(think, bool):
        raise ValueError(f"think: expected true or false, got {think!r}")
    return think


def think_prompt_ids(
    block: Callable[[str], list[int]], prompt: str, understanding: bool
) -> list[int]:
    """The thinking prompt: system block, prompt block, the thinking's start token;
    `block(text)` is a text's `<|im_start|> text <|im_end|>` ids."""
    system = VLM_THINK_SYSTEM_PROMPT if understanding else GEN_THINK_SYSTEM_PROMPT
    ids = block(system) + block(prompt)
    return [*ids, ids[0]]


def thought(prompt_ids: list[int], bos: int) -> bool:
    """Whether a handed-off prompt is a thinking one (it ends with the thinking's start)."""
    return bool(prompt_ids) and prompt_ids[-1] == bos


def thinking_contexts(model: Any, hand: Any, guidance: bool) -> Any:
    """The contexts of a request whose understanding stage thought (`hand`: its rows, prompt
    and output ids; `model`: the `BagelImageModel`)."""
    from omnistage.families.bagel.text_to_image import Contexts

    lm = model.language_model
    prompt = hand.prompt_ids.tolist()
    output = [] if hand.output_ids is None else hand.output_ids.tolist()
    if output and output[-1] == model.eos:
        output = output[:-1]
    ids = prompt + output + [model.eos]
    rows = hand.rows.to(model.dtype)
    shape = (lm.num_layers, lm.num_kv_heads, lm.head_dim)
    full = lm.prefill(torch.tensor(ids[rows.shape[0] :]), from_rows(rows, *shape))[1]
    if not guidance:
        return Contexts(full)
    system = prompt.index(model.eos) + 1
    no_text = from_rows(rows[:system], *shape)
    no_image = from_rows(rows[: len(prompt) - 1], *shape)
    return Contexts(full, no_text, no_image)


def think_alone(
    model: Any, prompt: str, max_think_tokens: int, guidance: bool
) -> tuple[list[int], Any]:
    """(thinking ids, contexts) of `prompt` on the MoT alone, as the reference's
    `interleave_inference([prompt], think=True)` builds them (greedy thinking)."""
    from omnistage.families.bagel.text_to_image import Contexts

    lm = model.language_model
    system_ids = torch.tensor(model.prompt_ids(GEN_THINK_SYSTEM_PROMPT))
    system = lm.prefill(system_ids, lm.empty_context())[1]
    prompted = lm.prefill(torch.tensor(model.prompt_ids(prompt)), system)[1]
    thinking = model.answer(prompted, max_think_tokens)
    full = lm.prefill(torch.tensor([model.bos, *thinking, model.eos]), prompted)[1]
    if not guidance:
        return thinking, Contexts(full)
    return thinking, Contexts(full, system, prompted)
