"""Bagel thinking before drawing (`model_options={"think": True}` on the understanding stage),
end to end on the tiny float64 checkpoint.

The understanding stage thinks (system and prompt blocks, then the thinking up to
`<|im_end|>` or `max_tokens`); the hand-off carries exactly the rows of the prompt and of
the thinking tokens it computed for good, never a row of a step scheduled ahead (a stop
token the async scheduler cannot foresee: it has already run the step after it); the draw
stage prefills the rest and draws. The image bytes are identical for sync and async
scheduling, with guidance on (text and image branches) and off, and equal to the MoT
thinking and drawing alone (`thinking.think_alone`, the reference's `think=True` path).
Bad options are refused naming them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.bagel.edges import BagelPromptKV
from omnistage.families.bagel.flow import FlowEulerScheduler, GuidanceSettings
from omnistage.families.bagel.text_to_image import BagelImageModel
from omnistage.families.bagel.thinking import think_alone
from omnistage.families.bagel.tiny import make_demo_bagel
from omnistage.pipeline.omni import Omni

PROMPT = "a red cube on a blue floor"
SIZE, STEPS, SEED, THINK = 16, 3, 11, 5
IMG = {"cfg_img_scale": 1.5, "cfg_interval": [0.0, 1.0]}
THINKING = {"think": True}
EOS = 2
"""`<|im_end|>` in the demo's tokenizer."""


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_demo_bagel(tmp_path_factory.mktemp("demo-bagel"), 0)


def _draw(guidance: float) -> DiffusionParams:
    options = IMG if guidance > 1 else {}
    return DiffusionParams(
        height=SIZE,
        width=SIZE,
        num_inference_steps=STEPS,
        guidance_scale=guidance,
        seed=SEED,
        model_options=options,
    )


def _think(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, model_options=THINKING, **kwargs)


def _session(ckpt, async_scheduling: bool, stop: int) -> dict:
    out: dict = {}
    handed: list = []
    original = BagelPromptKV.to_diffusion_input

    def recording(self, payload):
        result = original(self, payload)
        handed.append(result["kv_context"])
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BagelPromptKV, "to_diffusion_input", recording)
        with Omni(
            model=str(ckpt), in_process=True, dtype="float64", async_scheduling=async_scheduling
        ) as omni:
            for guidance in (1.0, 3.0):
                plain = SamplingParams(temperature=0.0, max_tokens=1)
                at_once = _think(max_tokens=THINK, logit_bias={EOS: 100.0})
                runs = omni.generate(
                    [PROMPT, PROMPT, PROMPT, PROMPT],
                    [
                        {"understanding": u, "draw": _draw(guidance)}
                        for u in (
                            _think(max_tokens=THINK),
                            plain,
                            _think(max_tokens=THINK),
                            at_once,
                        )
                    ],
                )
                assert all(o.error is None for o in runs)
                out["image", guidance] = [o.image_array for o in runs]
                out["thinking", guidance] = runs[0].outputs["understanding"].token_ids
            handed.clear()
            (stopped,) = omni.generate(
                [PROMPT],
                {"understanding": _think(max_tokens=8, stop_token_ids=[stop]), "draw": _draw(3.0)},
            )
            assert stopped.error is None
            out["stop"] = (handed[0], stopped.image_array)
            assert all(not any(c.values()) for c in omni.stage_counters().values())
    return out


def _alone(
    model: BagelImageModel, guidance: float, count: int = THINK
) -> tuple[list[int], np.ndarray]:
    thinking, contexts = think_alone(model, PROMPT, count, guidance > 1)
    block = model.generator.block(SIZE, SIZE)
    noise = torch.randn((1, block.h, block.w, 16), generator=torch.Generator().manual_seed(SEED))
    x = noise.reshape(block.num_tokens, 16).to(torch.float64)
    settings = GuidanceSettings(img_scale=1.5, interval=(0.0, 1.0)) if guidance > 1 else None
    scheduler = FlowEulerScheduler(STEPS, model.config.timestep_shift)
    for t in scheduler.timesteps:
        v = model.velocity(x, float(t), block, contexts, guidance, settings or GuidanceSettings())
        x = scheduler.step(v, t, x)[0]
    return thinking, model.to_pixels(x, block).numpy()


@pytest.fixture(scope="module")
def model(ckpt):
    return BagelImageModel(ckpt / "bagel", torch.float64)


@pytest.fixture(scope="module")
def stop(model) -> tuple[int, int]:
    """(index, id) of the first greedy thinking token after the first two that is new."""
    thinking, _ = think_alone(model, PROMPT, 8, False)
    return next((i, t) for i, t in enumerate(thinking) if i >= 2 and t not in thinking[:i])


@pytest.fixture(scope="module")
def runs(ckpt, stop):
    return {mode: _session(ckpt, mode, stop[1]) for mode in (False, True)}


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_thinking_images_sync_async_identical_and_equal_to_the_model_alone(
    runs, model, guidance
) -> None:
    sync = runs[False]["image", guidance]
    assert sync[0].shape == (SIZE, SIZE, 3) and np.array_equal(sync[0], sync[2])
    for mode in (False, True):
        for got, want in zip(runs[mode]["image", guidance], sync, strict=True):
            assert np.array_equal(got, want)
    thinking, alone = _alone(model, guidance)
    assert runs[False]["thinking", guidance] == thinking and len(thinking) == THINK
    assert np.array_equal(alone, sync[0])
    assert not np.array_equal(sync[0], sync[1])  # thinking changes the picture
    # Thinking that ends at once (<|im_end|> first): the context closes the empty thought.
    assert np.array_equal(_alone(model, guidance, 0)[1], sync[3])
    assert not np.array_equal(sync[3], sync[0]) and not np.array_equal(sync[3], sync[1])


def test_handed_off_rows_are_the_confirmed_thinking_under_async(runs, stop) -> None:
    """A stop token async scheduling could not foresee: the step after it already ran, and
    none of its KV reaches the hand-off: the rows are sync's, bit for bit, one per prompt
    token and per thinking token before the stop."""
    (sync, sync_image), (asyn, async_image) = runs[False]["stop"], runs[True]["stop"]
    prompt = sync.prompt_ids.shape[0]
    assert sync.output_ids.tolist()[-1] == stop[1] and sync.output_ids.shape[0] == stop[0] + 1
    assert sync.rows.shape[0] == prompt + stop[0]
    assert torch.equal(sync.rows, asyn.rows) and torch.equal(sync.output_ids, asyn.output_ids)
    assert np.array_equal(sync_image, async_image)


def test_bad_options_are_refused_naming_them(ckpt) -> None:
    with Omni(model=str(ckpt), in_process=True) as omni:
        for options, field in [({"think": "yes"}, "think"), ({"thinc": True}, "thinc")]:
            params = SamplingParams(temperature=0.0, model_options=options)
            (out,) = omni.generate([PROMPT], {"understanding": params, "draw": _draw(1.0)})
            assert out.error is not None and f"{field}: " in out.error
        image = np.zeros((16, 16, 3), np.uint8)
        (edit,) = omni.generate(
            [{"prompt": PROMPT, "multi_modal_data": {"image": image}}],
            {"understanding": _think(), "draw": _draw(1.0)},
        )
        assert edit.error is not None and "think: " in edit.error
        assert all(not any(c.values()) for c in omni.stage_counters().values())


def test_a_model_that_takes_no_options_refuses_them(tiny_llama) -> None:
    """`model_options` are read by a stage's prompter (Bagel's); any other model's engine
    refuses them, naming the field, rather than ignoring them."""
    from omnistage import LLM

    with pytest.raises(ValueError, match="model_options: expected a mapping"):
        SamplingParams(model_options=["think"])  # type: ignore[arg-type]
    llm = LLM(str(tiny_llama), max_model_len=64)
    with pytest.raises(ValueError, match=r"model_options: this model takes no options \(got think"):
        llm.generate("hi", SamplingParams(model_options=THINKING), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
