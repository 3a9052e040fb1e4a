"""HunyuanImage-3's `bot_task` as a request option (`chat_template_kwargs`), on the tiny
float64 checkpoint with `demo-hunyuan-image3`'s deploy: each mode's answer has the
sections the reference's bot_task gives, the same tokens and image bytes under sync and
async scheduling, and an unknown mode is refused before any stage runs, naming the field.

- think_recaption (default): `<think>` opens the answer; `</think>` forces `<recaption>`;
- recaption: `<recaption>` opens it; `</recaption>` forces `<answer><boi><img_size>`;
- image: the prompt ends with `<answer><boi><img_size>`: the sampler, reading that real
  prompt token, picks the ratio and ends at once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from omnistage.diffusion.params import DiffusionParams
from omnistage.families.hunyuan_image3.sampler import HunyuanImage3Sampler
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids
from omnistage.families.hunyuan_image3.tokens import HunyuanTokens
from omnistage.pipeline.deploy import packaged_deploy_path
from omnistage.pipeline.omni import Omni
from omnistage.sample.stage_transitions import SectionBudget

PROMPTS = ["a cat on a mat", "two dogs"]
IDS = token_ids(64)
RATIOS = {IDS[f"<img_ratio_{i}>"] for i in range(37)}
DRAW = {"height": 64, "width": 64, "num_inference_steps": 2, "guidance_scale": 2.5}
MODES = ("think_recaption", "recaption", "image")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3bt"), seed=1, image_base_size=64)


def deploy(async_scheduling: bool) -> dict:
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    for stage in spec["stages"]:
        stage["engine_args"]["dtype"] = "float64"
    spec["stages"][0]["engine_args"]["async_scheduling"] = async_scheduling
    return spec


def generate(omni: Omni, mode: str | None) -> list[tuple[list[int], np.ndarray]]:
    params = [DiffusionParams(**DRAW, seed=i) for i in range(len(PROMPTS))]
    chats = []
    for p in PROMPTS:
        chat = {"messages": [{"role": "user", "content": p}]}
        if mode is not None:
            chat["chat_template_kwargs"] = {"bot_task": mode}
        chats.append(chat)
    outs = omni.generate(chats, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [(o.outputs["thinker"].token_ids, o.image_array) for o in outs]


@pytest.fixture(scope="module")
def sync(ckpt):
    with Omni(deploy(False), model=str(ckpt), in_process=True) as omni:
        return {mode: generate(omni, mode) for mode in MODES}


@pytest.fixture(scope="module")
def omni(ckpt):
    with Omni(deploy(True), model=str(ckpt), in_process=True) as omni:
        yield omni


def _opens_image(tokens: list[int]) -> None:
    """`<answer><boi><img_size>`, a ratio, the end."""
    assert tokens[-5:-2] == [IDS["<answer>"], IDS["<boi>"], IDS["<img_size_64>"]]
    assert tokens[-2] in RATIOS and tokens[-1] == 2


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_is_the_same_sync_and_async(sync, omni, mode):
    batched = generate(omni, mode)
    for (tokens_a, image_a), (tokens_b, image_b) in zip(sync[mode], batched, strict=True):
        assert tokens_a == tokens_b and np.array_equal(image_a, image_b)
        assert image_a.shape == (64, 64, 3) and image_a.std() > 0
    assert all(not any(c.values()) for c in omni.stage_counters().values())


def _forced_sections_hold(tokens: list[int]) -> None:
    """Wherever the model closed a section, the sampler opened the next one."""
    for i, token in enumerate(tokens[:-1]):
        if token == IDS["</think>"]:
            assert tokens[i + 1] == IDS["<recaption>"]
        if token == IDS["</recaption>"]:
            assert tokens[i + 1 : i + 4] == [IDS["<answer>"], IDS["<boi>"], IDS["<img_size_64>"]]
    assert tokens[-2] in RATIOS and tokens[-1] == 2


def test_each_mode_writes_its_sections(sync):
    for tokens, _ in sync["think_recaption"]:
        _forced_sections_hold(tokens)
        closes = [tokens.index(t) for t in (IDS["</think>"], IDS["</recaption>"]) if t in tokens]
        assert min(closes) <= 24  # the thought's budget counts from the prompt's <think>
    for tokens, _ in sync["recaption"]:
        _forced_sections_hold(tokens)
        assert tokens.index(IDS["</recaption>"]) <= 32  # from the prompt's <recaption>
    for tokens, _ in sync["image"]:
        assert len(tokens) == 2 and tokens[0] in RATIOS and tokens[1] == 2
    think, recaption, image = (sync[m][0][1] for m in MODES)
    assert not np.array_equal(think, image) and not np.array_equal(recaption, image)


def test_default_mode_is_think_recaption(sync, omni):
    for (tokens, image), (want, want_image) in zip(
        generate(omni, None), sync["think_recaption"], strict=True
    ):
        assert tokens == want and np.array_equal(image, want_image)


def test_unknown_mode_is_refused_naming_the_field(omni):
    chat = {"messages": [{"role": "user", "content": "a cat"}], "chat_template_kwargs": {}}
    for bad in ("img_ratio", "think"):
        chat["chat_template_kwargs"] = {"bot_task": bad}
        with pytest.raises(ValueError, match=f"bot_task: expected one of .*got {bad}"):
            omni.generate([chat], DiffusionParams(**DRAW))
    with pytest.raises(ValueError, match="chat_template_kwargs: expected a dict"):
        omni.generate([{**chat, "chat_template_kwargs": ["x"]}], DiffusionParams(**DRAW))
    assert all(not any(c.values()) for c in omni.stage_counters().values())


def test_sampler_reads_the_prompts_last_token_only_before_any_output(ckpt):
    tokens = HunyuanTokens.from_checkpoint(ckpt, 64, 2)
    sampler = HunyuanImage3Sampler(tokens)
    logits = torch.zeros(3, 320, dtype=torch.float64)
    logits[:, IDS["<img_ratio_7>"]] = 1.0
    prompts = [[5, tokens.size], [5, tokens.size], [5, 6]]
    sampler.restrict(logits, [[], [40], []], prompts)
    assert int(logits[0].argmax()) == IDS["<img_ratio_7>"] and logits[0].isinf().sum() == 319
    assert not logits[1:].isinf().any()  # an output token, or a prompt that forces nothing


def test_budget_counts_from_a_section_the_prompt_opened():
    budget = SectionBudget(close=11, max_tokens=3, after=10)
    assert budget.forced_token([1, 2, 3]) is None  # nothing opened it
    assert budget.forced_token([1, 2], prompt_last=10) is None
    assert budget.forced_token([1, 2, 3], prompt_last=10) == 11
    assert budget.forced_token([1, 11, 2, 3], prompt_last=10) is None  # closed: done
    assert budget.forced_token([1, 11, 10, 2, 3, 4], prompt_last=10) == 11  # reopened
    assert budget.forced_token([10, 2, 3], prompt_last=10) == 11  # a repeated opener: no restart
