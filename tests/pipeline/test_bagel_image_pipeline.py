"""Bagel with an input image end to end on the tiny float64 checkpoint: the understanding
stage (our AR engine) takes the image's context blocks, and either answers (image
understanding: text out) or hands the whole context's KV to the draw stage (editing).

Exactness: for sync and async scheduling, alone and batched with a text-to-image
request, the edited image's bytes, the handed-off KV rows and the answer's ids are
identical, and equal to what `BagelImageModel` computes alone (image blocks, then the
text, then the image or the greedy answer at the positions the reference gives them).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.bagel.edges import BagelPromptKV
from omnistage.families.bagel.text_to_image import BagelImageModel
from omnistage.families.bagel.tiny import make_demo_bagel
from omnistage.pipeline.omni import Omni

EDIT, QUESTION, T2I = "make it blue", "describe the image", "two cats"
H, W, STEPS, SEED, ANSWER = 24, 32, 3, 5, 6


def _image() -> np.ndarray:
    return np.random.default_rng(11).integers(0, 256, size=(H, W, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_demo_bagel(tmp_path_factory.mktemp("demo-bagel"), 0)


OPTIONS = {
    "cfg_img_scale": 2.0,
    "cfg_interval": [0.0, 1.0],
    "cfg_renorm_type": "text_channel",
    "cfg_renorm_min": 0.1,
    "timestep_shift": 1.5,
}
"""The reference app's editing settings, shift changed: per-request `model_options`."""


def _draw(guidance: float, options: dict | None = None) -> DiffusionParams:
    return DiffusionParams(
        height=H,
        width=W,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        seed=SEED,
        model_options=options or {},
    )


def _session(ckpt, async_scheduling: bool) -> dict:
    out: dict = {}
    handed: dict[int, torch.Tensor] = {}
    original = BagelPromptKV.to_diffusion_input

    def recording(self, payload):
        handed[int(payload["ids.prompt"].shape[0])] = payload["hidden_states.output"].clone()
        return original(self, payload)

    edit = {"prompt": EDIT, "multi_modal_data": {"image": _image()}}
    question = {"prompt": QUESTION, "multi_modal_data": {"image": _image()}}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BagelPromptKV, "to_diffusion_input", recording)
        with Omni(
            model=str(ckpt), in_process=True, dtype="float64", async_scheduling=async_scheduling
        ) as omni:
            for guidance in (1.0, 3.0):
                (alone,) = omni.generate([edit], {"draw": _draw(guidance)}, modalities=["image"])
                out["edit", guidance] = alone.image_array
            (tuned,) = omni.generate([edit], {"draw": _draw(4.0, OPTIONS)}, modalities=["image"])
            out["edit", "options"] = tuned.image_array
            handed.clear()
            both = omni.generate([edit, T2I], {"draw": _draw(3.0)}, modalities=["image"])
            out["batched"] = [o.image_array for o in both]
            out["kv"] = dict(handed)
            answer = SamplingParams(temperature=0.0, max_tokens=ANSWER)
            outs = omni.generate(
                [question, question], {"understanding": answer}, modalities=["text"]
            )
            out["answers"] = [list(o.token_ids) for o in outs]
            content = [{"type": "image", "image": _image()}, {"type": "text", "text": QUESTION}]
            chat = {"messages": [{"role": "user", "content": content}]}
            (asked,) = omni.generate([chat], {"understanding": answer}, modalities=["text"])
            out["chat answer"] = list(asked.token_ids)
            assert all(not any(c.values()) for c in omni.stage_counters().values())
    return out


@pytest.fixture(scope="module")
def runs(ckpt):
    return {mode: _session(ckpt, mode) for mode in (False, True)}


@pytest.fixture(scope="module")
def model(ckpt):
    return BagelImageModel(ckpt / "bagel", torch.float64)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_edit_sync_async_batched_identical_and_equal_to_the_model_alone(runs, model, guidance):
    reference = runs[False]["edit", guidance]
    assert reference.shape == (H, W, 3) and reference.std() > 0
    for mode in (False, True):
        assert np.array_equal(runs[mode]["edit", guidance], reference)
    block = model.generator.block(H, W)
    noise = torch.randn((1, block.h, block.w, 16), generator=torch.Generator().manual_seed(SEED))
    _, alone = model.generate(
        [_image(), EDIT], H, W, STEPS, noise.reshape(block.num_tokens, 16), text_scale=guidance
    )
    assert np.array_equal(alone.numpy(), reference)


def test_per_request_guidance_options_reach_the_draw_stage(runs, model):
    """`model_options` (image guidance, interval, renormalisation, shift) change the edit
    exactly as they change `BagelImageModel`'s, sync and async alike."""
    from omnistage.families.bagel.flow import read_options, settings_of

    reference = runs[False]["edit", "options"]
    assert np.array_equal(runs[True]["edit", "options"], reference)
    assert not np.array_equal(reference, runs[False]["edit", 3.0])
    block = model.generator.block(H, W)
    noise = torch.randn((1, block.h, block.w, 16), generator=torch.Generator().manual_seed(SEED))
    options = read_options(OPTIONS, 3.0)
    _, alone = model.generate(
        [_image(), EDIT],
        H,
        W,
        STEPS,
        noise.reshape(block.num_tokens, 16),
        text_scale=4.0,
        settings=settings_of(options),
        shift=options["timestep_shift"],
    )
    assert np.array_equal(alone.numpy(), reference)


def test_edit_batched_with_text_to_image(runs):
    for mode in (False, True):
        edited, drawn = runs[mode]["batched"]
        assert np.array_equal(edited, runs[False]["edit", 3.0])
        assert np.array_equal(drawn, runs[False]["batched"][1])
    assert not np.array_equal(runs[False]["edit", 1.0], runs[False]["edit", 3.0])


def test_handed_off_kv_carries_the_image_context(runs, model):
    """The rows handed off (image blocks, then the text) are sync's bit for bit under
    async, and equal the MoT's own context of image + text."""
    sync, asyn = runs[False]["kv"], runs[True]["kv"]
    assert sorted(sync) == sorted(asyn) and len(sync) == 2
    for n in sync:
        assert torch.equal(sync[n], asyn[n])
    context = model.contexts([_image(), EDIT], guidance=False).full
    rows = sync[context.length]
    torch.testing.assert_close(rows[: context.length], context.to_rows(), rtol=0, atol=1e-12)


def test_understanding_answer_is_the_models_greedy_text(runs, model):
    context = model.contexts([_image(), QUESTION], False, understanding=True).full
    expected = model.answer(context, ANSWER)
    assert len(set(expected)) > 2
    for mode in (False, True):
        assert runs[mode]["answers"] == [expected, expected]
        assert runs[mode]["chat answer"] == expected  # a chat: the user's text, no template


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_chunked_prefill_splits_the_image_blocks_and_changes_nothing(ckpt, runs, async_scheduling):
    """With 16-token steps the image blocks (an edit: 50 VAE + 50 ViT tokens) are prefilled
    in chunks, each taking its share of the given KV rows: the answer and the edit are the
    same bytes as in one step."""
    edit = {"prompt": EDIT, "multi_modal_data": {"image": _image()}}
    question = {"prompt": QUESTION, "multi_modal_data": {"image": _image()}}
    with Omni(
        model=str(ckpt),
        in_process=True,
        dtype="float64",
        async_scheduling=async_scheduling,
        max_num_batched_tokens=16,
    ) as omni:
        (edited,) = omni.generate([edit], {"draw": _draw(3.0)}, modalities=["image"])
        answer = SamplingParams(temperature=0.0, max_tokens=ANSWER)
        (text,) = omni.generate([question], {"understanding": answer}, modalities=["text"])
        assert all(not any(c.values()) for c in omni.stage_counters().values())
    assert np.array_equal(edited.image_array, runs[False]["edit", 3.0])
    assert list(text.token_ids) == runs[False]["answers"][0]
