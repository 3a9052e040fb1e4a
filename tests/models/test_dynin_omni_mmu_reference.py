"""Dynin-Omni's text ("mmu") requests against the reference on the tiny checkpoint
(fixture `fixtures/dynin_omni/mmu_reference.npz`, made by `make_mmu_fixture.py` there):

- a chat rendered as the server and the offline prompt reader render it (the checkpoint
  tokenizer's template, `render_request_chat`) and tokenized by token2text gives the ids
  vLLM-Omni's Dynin `t2t` builds (`apply_chat_template`, then no special tokens), one
  and several turns;
- the answer is Dynin's `mmu_generate` on them, token for token (float32);
- the tiny tokenizer's template is Dynin's layout (one newline after each header);
- an image or speech request rendered as a chat takes its user text (vLLM-Omni's online
  `normalize_dynin_online_prompt_text`): the same codes and units as the bare text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.families.dynin_omni.prompting import chat_user_text
from omnistage.families.dynin_omni.tiny import make_tiny_dynin_omni
from omnistage.families.dynin_omni.token2text import DyninToken2Text
from omnistage.models.generation import GenerationItem
from omnistage.multimodal.request_chat import render_request_chat

FIXTURE = Path(__file__).parents[1] / "fixtures" / "dynin_omni" / "mmu_reference.npz"
CHATS = [  # as make_mmu_fixture.py
    [{"role": "user", "content": "hello"}],
    [{"role": "user", "content": "What is 2 + 2? Answer in one short sentence."}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Why?"},
    ],
]


@pytest.fixture(scope="module")
def reference():
    return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_tiny_dynin_omni(tmp_path_factory.mktemp("dynin") / "tiny", seed=0)


@pytest.fixture(scope="module")
def model(checkpoint):
    return DyninToken2Text.from_checkpoint(checkpoint, None, torch.float32)


def _rendered(model: DyninToken2Text, checkpoint: Path, messages: list) -> str:
    return render_request_chat(model.tokenizer, messages, config=checkpoint).prompt


def test_the_tiny_template_is_dynins_chat_layout(model, checkpoint):
    prompt = _rendered(model, checkpoint, CHATS[0])
    assert prompt == (
        f"{model.tokenizer.bos_token}<|start_header_id|>user<|end_header_id|>\nhello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n"
    )


def test_chat_prompt_ids_and_answers_equal_the_reference(reference, model, checkpoint):
    cfg = model.cfg
    for i, messages in enumerate(CHATS):
        rows = model.prompt_rows(_rendered(model, checkpoint, messages), None)
        expected = reference[f"mmu_prompt/{i}"]
        assert rows.tolist() == expected.tolist(), i
        (answer,) = model.generate([GenerationItem(rows, meta={"modalities": "text"})])
        region = torch.from_numpy(reference[f"mmu_text/{i}"][expected.size :])
        ends = (region == cfg.eos_token_id).nonzero()
        assert answer.tolist() == (region[: int(ends[0])] if ends.numel() else region).tolist()


def test_chat_user_text_is_vllm_omnis_extraction():
    chat = "<|start_header_id|>user<|end_header_id|>\n  a  red\ncat <|eot_id|>"
    assert chat_user_text(chat + "<|start_header_id|>assistant<|end_header_id|>\n") == "a red cat"
    assert chat_user_text("  plain   text ") == "plain text"


@pytest.mark.parametrize("task", ["image", "audio"])
def test_image_and_speech_chats_take_the_user_text(model, checkpoint, task):
    bare = model.prompt_rows("a cat", None)
    chat = model.prompt_rows(
        _rendered(model, checkpoint, [{"role": "user", "content": "a cat"}]), None
    )
    assert model.task_text(chat).tolist() == bare.tolist()
    outputs = [
        model.generate([GenerationItem(rows, seed=3, meta={"modalities": task})])[0]
        for rows in (bare, chat)
    ]
    assert outputs[0].tolist() == outputs[1].tolist()


def test_image_codes_equal_show_os_magvit(reference, model):
    """MAGVITv2's encoder and look-up-free quantizer after the i2t preprocessing (a
    non-square image resized and cropped, and a square one): Show-o's codes exactly."""
    assert model.image_codes is not None
    for i in range(2):
        codes = model.image_codes(reference[f"image/{i}"])
        assert codes.tolist() == reference[f"image_codes/{i}"].tolist(), i


@pytest.mark.parametrize("as_chat", [False, True])
def test_image_prompts_and_answers_equal_the_i2t_reference(reference, model, checkpoint, as_chat):
    """The mmu prompt of an image and a question (given bare, or as a rendered chat) is
    the i2t example's ids, and the answer is `mmu_generate`'s on them."""
    for i, question in enumerate(["What is in the image?", "Describe it."]):
        text = question
        if as_chat:
            text = _rendered(model, checkpoint, [{"role": "user", "content": question}])
        ids = model.image_prompt(reference[f"image/{i}"], model.prompt_rows(text, None))
        expected = reference[f"i2t_prompt/{i}"]
        assert ids.tolist() == expected.tolist(), i
        (answer,) = model.generate([GenerationItem(ids, meta={"modalities": "text"})])
        region = torch.from_numpy(reference[f"i2t_text/{i}"][expected.size :])
        ends = (region == model.cfg.eos_token_id).nonzero()
        assert answer.tolist() == (region[: int(ends[0])] if ends.numel() else region).tolist()


def test_bad_images_are_value_errors_naming_the_field(model):
    prompt = model.prompt_rows("hi", None)
    with pytest.raises(ValueError, match="image"):
        model.image_prompt(np.zeros((4, 4), dtype=np.uint8), prompt)
    encoder, model.image_codes = model.image_codes, None
    try:
        with pytest.raises(ValueError, match="multi_modal_data"):
            model.image_prompt(np.zeros((4, 4, 3), dtype=np.uint8), prompt)
    finally:
        model.image_codes = encoder
