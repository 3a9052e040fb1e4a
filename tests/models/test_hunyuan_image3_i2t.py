"""HunyuanImage-3 image-to-text: a prompt with an input image through its multimodal
processor (`input_encoder.py`: the joint-image block of VAE and ViT tokens, 2-D
positions) and its thinker on our engine (paged KV, the image runs attending both ways).

- against the reference (`tests/fixtures/hunyuan_image3/i2t.pt`, made by
  `make_i2t_fixture.py` from the official modules on the same tiny random weights; its
  docstring says what is the reference's): the expanded prompt is its sequence, greedy
  decoding gives its tokens until a ratio token (after which our model's own sampler
  ends the answer, as the reference's generation does) and its logits within 1e-4
  (float32; values ~5);
- exact: on float64, sync == async scheduling, alone == batched with text prompts;
- refusals name the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from omnistage import LLM, SamplingParams
from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.families.hunyuan_image3.input_encoder import HunyuanImage3InputEncoder
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids
from omnistage.pipeline.deploy import packaged_deploy_path
from omnistage.pipeline.omni import Omni

FIXTURE = torch.load(
    Path(__file__).parents[1] / "fixtures" / "hunyuan_image3" / "i2t.pt", weights_only=True
)
IDS = token_ids()
PLACEHOLDER = [IDS["<boi>"], IDS["<img>"], IDS["<eoi>"]]
ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3i2t"), seed=0)


def _prompt() -> list[int]:
    return FIXTURE["before"] + PLACEHOLDER + FIXTURE["after"]


def test_prompt_is_the_references_sequence(ckpt):
    encoder = HunyuanImage3InputEncoder.from_checkpoint(ckpt, torch.float32)
    encoded = encoder.encode(_prompt(), images=[FIXTURE["image"].numpy()])
    assert encoded.prompt_token_ids == FIXTURE["prompt"]
    n = len(FIXTURE["prompt"])
    assert encoded.prompt_embeds.shape == (n, 64) and encoded.mrope_positions.shape == (3, n)
    text = ~encoded.visual_pos_mask
    assert torch.equal(encoded.mrope_positions[1][text], encoded.mrope_positions[2][text])


def test_greedy_tokens_and_logits_match_reference(ckpt):
    encoder = HunyuanImage3InputEncoder.from_checkpoint(ckpt, torch.float32)
    encoded = encoder.encode(_prompt(), images=[FIXTURE["image"].numpy()])
    llm = LLM(str(ckpt), dtype="float32", executor_backend="thread")
    seen: list[torch.Tensor] = []
    llm.engine.core.executor.runner.add_sample_observer(lambda event: seen.append(event.logits))
    llm.engine.add_tokenized_request(
        "i2t",
        None,
        encoded.prompt_token_ids,
        SamplingParams(temperature=0, max_tokens=len(FIXTURE["tokens"])),
        encoded.prompt_embeds,
        False,
        MultimodalDecoderInputs.from_encoded_prompt(encoded),
    )
    (out,) = llm._drain(["i2t"], False)
    tokens = list(out.outputs[0].token_ids)
    want = FIXTURE["tokens"]
    ratio = next((i for i, t in enumerate(want) if 270 <= t <= 306), len(want) - 1)
    assert tokens[: ratio + 1] == want[: ratio + 1] and tokens[ratio + 1 :] in ([], [2])
    logits = torch.cat(seen)[: ratio + 1]
    torch.testing.assert_close(logits, FIXTURE["logits"][: ratio + 1], atol=ATOL, rtol=0)
    # The image matters: another picture, the same words, other first logits.
    other = encoder.encode(_prompt(), images=[255 - FIXTURE["image"].numpy()])
    seen.clear()
    llm.engine.add_tokenized_request(
        "other",
        None,
        other.prompt_token_ids,
        SamplingParams(temperature=0, max_tokens=1),
        other.prompt_embeds,
        False,
        MultimodalDecoderInputs.from_encoded_prompt(other),
    )
    llm._drain(["other"], False)
    assert (seen[0][0] - FIXTURE["logits"][0]).abs().max() > 1e-2


def _deploy(async_scheduling: bool) -> dict:
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    thinker = spec["stages"][0]
    thinker["engine_args"].update(dtype="float64", async_scheduling=async_scheduling)
    thinker["default_sampling"]["max_tokens"] = 6
    spec["stages"], spec["edges"] = [thinker], []
    return spec


def _chats() -> list[dict]:
    rng = np.random.RandomState(1)
    images = [rng.randint(0, 256, hw + (3,)).astype(np.uint8) for hw in ((20, 60), (60, 20))]
    auto = {"bot_task": "auto"}
    image_parts = [
        [{"type": "image", "image": im}, {"type": "text", "text": "what?"}] for im in images
    ]
    return [
        {"messages": [{"role": "user", "content": image_parts[0]}], "chat_template_kwargs": auto},
        {
            "messages": [{"role": "user", "content": "a plain question"}],
            "chat_template_kwargs": auto,
        },
        {"messages": [{"role": "user", "content": image_parts[1]}], "chat_template_kwargs": auto},
    ]


def _run(omni: Omni, chats: list[dict]) -> list[list[int]]:
    outs = omni.generate(chats)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    return [o.outputs["thinker"].token_ids for o in outs]


def test_sync_equals_async_alone_and_batched_on_float64(ckpt):
    chats = _chats()
    with Omni(_deploy(False), model=str(ckpt), in_process=True) as omni:
        sync = _run(omni, chats)
    with Omni(_deploy(True), model=str(ckpt), in_process=True) as omni:
        assert _run(omni, chats) == sync
        assert _run(omni, chats[2:]) == sync[2:]  # alone
        image = np.zeros((8, 8, 3), np.uint8)
        (out,) = omni.generate([{"prompt": "no image", "multi_modal_data": {"image": image}}])
        assert "image: the prompt has 0 image placeholder(s) for 1 image(s)" in out.error
    assert all(len(t) == 6 for t in sync)


def test_refusals_name_the_field(ckpt):
    encoder = HunyuanImage3InputEncoder.from_checkpoint(ckpt, torch.float32)
    image = FIXTURE["image"].numpy()
    with pytest.raises(ValueError, match="image: the prompt has 1 image placeholder"):
        encoder.encode(_prompt(), images=[image, image])
    with pytest.raises(ValueError, match="audio: HunyuanImage-3 does not accept audio"):
        encoder.encode(_prompt(), audios=[np.zeros(100)], images=[image])
    with pytest.raises(ValueError, match="image: expected an 8-bit"):
        encoder.encode(_prompt(), images=[image.astype(np.float32)])


def test_image_spans_are_the_runs_and_a_split_run_is_refused():
    from types import SimpleNamespace

    from omnistage.families.hunyuan_image3.model import image_spans
    from omnistage.layers.attention import PrefillSeq

    img, sep = IDS["<img>"], IDS["<joint_img_sep>"]
    image_ids = torch.tensor([img, sep])
    blocks = torch.tensor([3, 4])
    # one sequence of 8 rows after 10 cached positions: text, img img sep img, eoi, text;
    # a single <img> (a generated one) is no run.
    ids = torch.tensor([5, img, img, sep, img, IDS["<eoi>"], 6, img])
    meta = SimpleNamespace(prefills=[PrefillSeq(0, 7, 10, blocks)])
    (span,) = image_spans(ids, meta, image_ids)
    assert (span.first, span.last, span.keys) == (1, 5, 15)  # sees positions 0..14
    split = SimpleNamespace(prefills=[PrefillSeq(0, 4, 10, blocks)])  # ends inside the run
    with pytest.raises(ValueError, match="max_num_batched_tokens: an input image's tokens"):
        image_spans(ids, split, image_ids)
