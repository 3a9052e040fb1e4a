"""GLM-Image end to end on a tiny float64 checkpoint in the real diffusers layout: our
prior (our engine) -> our draw stage gives the image transformers' greedy `generate` and
diffusers' `GlmImagePipeline` give together, sync and async; the size reaches the prior."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.glm_image.tiny import make_tiny_glm_image
from omnistage.pipeline.omni import Omni

CASES = [('A sign that says "OPEN"', 64, 96), ("a cat on a mat", 96, 64)]
STEPS, GUIDANCE, SEED = 2, 1.5, 7


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_glm_image(tmp_path_factory.mktemp("glm-image"))


def _reference_image(ckpt, prompt: str, height: int, width: int) -> np.ndarray:
    """transformers' greedy prior tokens, drawn by diffusers' pipeline from our seed's noise."""
    from diffusers import GlmImagePipeline
    from transformers import AutoProcessor, GlmImageForConditionalGeneration

    processor = AutoProcessor.from_pretrained(ckpt / "processor")
    prior = GlmImageForConditionalGeneration.from_pretrained(
        ckpt / "vision_language_encoder", dtype=torch.float64
    ).eval()
    inputs = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"target_h": height, "target_w": width},
    )
    grids = inputs["image_grid_thw"]
    max_new, offset, token_h, token_w = GlmImagePipeline._compute_generation_params(grids, True)
    with torch.no_grad():
        out = prior.generate(**inputs, max_new_tokens=max_new, do_sample=False)
    large = GlmImagePipeline._extract_large_image_tokens(
        out, inputs["input_ids"].shape[1], offset, token_h * token_w
    )
    prior_ids = GlmImagePipeline._upsample_token_ids(large, token_h, token_w)
    pipe = GlmImagePipeline.from_pretrained(
        ckpt, dtype=torch.float64, vision_language_encoder=None, processor=None
    )
    pipe.set_progress_bar_config(disable=True)
    noise = torch.randn(
        (1, 4, height // 8, width // 8), generator=torch.Generator().manual_seed(SEED)
    )
    image = pipe(
        prompt=prompt,
        height=height,
        width=width,
        num_inference_steps=STEPS,
        guidance_scale=GUIDANCE,
        latents=noise.to(torch.float64),
        prior_token_ids=prior_ids,
        output_type="np",
    ).images[0]
    return (image * 255).round().astype(np.uint8)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_same_image_as_transformers_and_diffusers(ckpt, async_scheduling) -> None:
    with Omni(
        model=str(ckpt), in_process=True, dtype="float64", async_scheduling=async_scheduling
    ) as omni:
        assert [s.name for s in omni.deploy.stages] == ["prior", "draw"]  # picked by model_index
        outs = omni.generate(
            [prompt for prompt, _, _ in CASES],
            [
                {
                    "prior": SamplingParams(temperature=0.0),
                    "draw": DiffusionParams(
                        height=h,
                        width=w,
                        num_inference_steps=STEPS,
                        guidance_scale=GUIDANCE,
                        seed=SEED,
                    ),
                }
                for _, h, w in CASES
            ],
        )
        assert all(not any(c.values()) for c in omni.stage_counters().values())
    for out, (prompt, height, width) in zip(outs, CASES, strict=True):
        assert out.error is None
        assert out.image_array.shape == (height, width, 3)
        assert np.array_equal(out.image_array, _reference_image(ckpt, prompt, height, width))


def test_sizes_the_model_cannot_draw_are_refused_up_front(ckpt) -> None:
    with Omni(model=str(ckpt), in_process=True, dtype="float64") as omni:
        with pytest.raises(ValueError, match="height: 80 is not supported"):
            omni.generate(["a cat"], DiffusionParams(height=80, width=64))
        with pytest.raises(ValueError, match="prompt: .* text-encoder tokens"):
            omni.generate(['"' + "x" * 3000 + '"'], DiffusionParams(height=64, width=64))
        assert all(not any(c.values()) for c in omni.stage_counters().values())


def test_cli_draws_the_prompt_as_given(ckpt, tmp_path) -> None:
    """The CLI hands GLM-Image's prior the text itself (its prompter applies the template)."""
    from PIL import Image

    from omnistage.entrypoints import cli

    out = tmp_path / "out"
    argv = ["generate", "a cat", "--model", str(ckpt), "--out", str(out), "--in-process"]
    argv += ["--height", "64", "--width", "96", "--num-inference-steps", "1", "--seed", "3"]
    assert cli.main(argv + ["--dtype", "float64"]) == 0
    with Image.open(out / "image.png") as image:
        assert image.size == (96, 64)
