"""Think -> recaption -> draw on a tiny float64 checkpoint: identical images sync and async,
alone and in a batch; the caption always follows `</think>`; bad input refused before any
stage runs; a request aborted mid-denoising frees everything; the CLI writes its files."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import torch
from PIL import Image

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.entrypoints import cli
from omnistage.families.text_to_image.tiny import make_tiny_image_pipeline
from omnistage.pipeline.omni import AsyncOmni, Omni
from omnistage.pipeline.recaption import split_thought
from omnistage.testing.tiny_deploys import tiny_image_deploy

PROMPTS = ["a red cat", "a blue dog on a hill", "two birds", "a house at night"]
SMALL = DiffusionParams(height=32, width=32, num_inference_steps=2)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_image_pipeline(tmp_path_factory.mktemp("image"), seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def ids(ckpt):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ckpt / "thinker")
    names = ["<|im_end|>", "<think>", "</think>", "<recaption>", "</recaption>"]
    return {name: tokenizer.convert_tokens_to_ids(name) for name in names}


def _chat(prompt: str) -> str:
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>"


def _counters_are_zero(omni) -> bool:
    return all(not any(c.values()) for c in omni.stage_counters().values())


def test_images_identical_sync_async_alone_and_batched(ckpt) -> None:
    results = {}
    for async_scheduling in (False, True):
        deploy = tiny_image_deploy(ckpt, async_scheduling=async_scheduling)
        with Omni(deploy, in_process=True) as omni:
            outs = omni.generate([_chat(p) for p in PROMPTS])
            (alone,) = omni.generate([_chat(PROMPTS[2])])
            assert _counters_are_zero(omni)
        for out in [*outs, alone]:
            assert out.error is None and out.image_array.shape == (64, 64, 3)
        assert torch.equal(
            torch.from_numpy(alone.image_array), torch.from_numpy(outs[2].image_array)
        )
        results[async_scheduling] = outs
    for sync, async_ in zip(results[False], results[True], strict=True):
        assert sync.token_ids == async_.token_ids
        assert sync.outputs["draw"].text == async_.outputs["draw"].text
        assert (sync.image_array == async_.image_array).all()
    images = [o.image_array for o in results[True]]
    assert not (images[0] == images[1]).all()  # different prompts, different pictures


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_caption_always_follows_think_over_100_sampled_requests(ckpt, ids, async_scheduling):
    """`</think>` comes at random (a logit bias, temperature 1); the transition forces
    `<recaption>` right after it every time, and the draw stage draws that caption."""
    think = SamplingParams(
        temperature=1.0,
        max_tokens=64,
        logit_bias={
            ids["</think>"]: 3.0,
            ids["<|im_end|>"]: -100.0,
            ids["<recaption>"]: -100.0,
            ids["</recaption>"]: -100.0,
        },
        skip_special_tokens=False,
    )
    deploy = tiny_image_deploy(ckpt, async_scheduling=async_scheduling)
    with Omni(deploy, in_process=True) as omni:
        params = [
            {"thinker": dataclasses.replace(think, seed=i), "draw": SMALL} for i in range(100)
        ]
        outs = omni.generate([_chat(f"picture {i}") for i in range(100)], params)
        assert _counters_are_zero(omni)
    thought_lengths = set()
    for out in outs:
        assert out.error is None
        tokens = out.token_ids
        ends = [i for i, t in enumerate(tokens) if t == ids["</think>"]]
        assert ends, "every request closed its thought"
        for i in ends:
            assert tokens[i + 1] == ids["<recaption>"]
        thought_lengths.add(ends[0])
        caption = split_thought(str(ckpt / "thinker"), tokens).caption
        assert caption and out.outputs["draw"].text == caption
        assert out.image_array.shape == (32, 32, 3)
    assert len(thought_lengths) > 5  # </think> really came at random places


def test_bad_input_is_refused_before_any_stage_runs(ckpt) -> None:
    with Omni(tiny_image_deploy(ckpt), in_process=True) as omni:
        for params, field in [
            (DiffusionParams(height=50), "height: 50 is not supported"),
            (DiffusionParams(width=1024), "width: 1024 is not supported"),
            (DiffusionParams(negative_prompt="n" * 300), "negative_prompt: .* text-encoder"),
        ]:
            with pytest.raises(ValueError, match=field):
                omni.generate([_chat("a cat")], {"draw": params})
        with pytest.raises(ValueError, match="prompt: .* text-encoder tokens"):
            omni.generate(["x" * 300])
        with pytest.raises(ValueError, match=r"sampling_params\['draw'\].*DiffusionParams"):
            omni.generate(["a cat"], {"draw": SamplingParams()})
        with pytest.raises(ValueError, match="num_inference_steps"):
            DiffusionParams(num_inference_steps=0)
        with pytest.raises(ValueError, match="guidance_scale"):
            DiffusionParams(guidance_scale=-0.5)
        assert _counters_are_zero(omni)
        (out,) = omni.generate([_chat("a cat")], {"thinker": SamplingParams(max_tokens=5)})
        assert "the thinker wrote no caption" in out.error
        assert out.image is None
        (ok,) = omni.generate([_chat("a cat")], SMALL)  # DiffusionParams alone: the draw stage
        assert ok.error is None and ok.image.size == (32, 32)
        assert _counters_are_zero(omni)


def test_abort_mid_denoising_frees_everything(ckpt) -> None:
    async def run() -> list[tuple[int, int]]:
        seen = []
        with AsyncOmni(tiny_image_deploy(ckpt), in_process=True) as omni:
            slow = DiffusionParams(height=32, width=32, num_inference_steps=500, progress=True)
            async for update in omni.generate(_chat("a cat"), {"draw": slow}, request_id="r"):
                if update.progress is not None:
                    seen.append(update.progress)
                    if update.progress[0] >= 3:
                        await omni.abort("r")
                if update.finished:
                    assert update.aborted
                    break
            deadline = time.monotonic() + 30
            while not _counters_are_zero(omni) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _counters_are_zero(omni)
        return seen

    seen = asyncio.run(run())
    assert seen[:3] == [(1, 500), (2, 500), (3, 500)]
    assert seen[-1][0] < 500


def test_cli_writes_thought_caption_and_png(ckpt, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code = cli.main(
        ["generate", "a red cat", "--model", str(ckpt), "--out", str(out), "--in-process"]
        + ["--height", "32", "--width", "64", "--num-inference-steps", "2"]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert printed.startswith("thought: ") and "\ncaption: " in printed
    caption = (out / "caption.txt").read_text()
    assert caption and caption in printed
    assert (out / "thought.txt").is_file()
    with Image.open(out / "image.png") as image:
        assert image.size == (64, 32) and image.mode == "RGB"
