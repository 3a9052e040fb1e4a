"""Every stage kind on a CUDA device, placed per stage by the deploy: Qwen3-Omni's thinker
(AR) and code2wav (generation) on `cuda:0` with its talker on the CPU give the all-CPU
pipeline's tokens and audio; GLM-Image's prior (AR) and draw (diffusion) on CUDA give
the CPU's image (float64 tiny checkpoints)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.diffusion.params import DiffusionParams
from omnistage.families.glm_image.tiny import make_tiny_glm_image
from omnistage.families.qwen3_omni.tiny import make_tiny_qwen3_omni
from omnistage.pipeline.omni import Omni
from omnistage.testing.tiny_deploys import tiny_qwen3_omni_deploy

pytestmark = pytest.mark.gpu

PROMPTS = [
    "<|im_start|>user\nSay a long sentence about cats<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n",
]
PARAMS = {
    "thinker": SamplingParams(temperature=0.8, seed=100, max_tokens=12),
    "talker": SamplingParams(temperature=0.9, top_k=50, seed=7, max_tokens=40),
}


def _placed(spec, devices: dict[str, str]):
    stages = tuple(
        dataclasses.replace(s, engine_args={**s.engine_args, "device": devices.get(s.name, "cpu")})
        for s in spec.stages
    )
    return dataclasses.replace(spec, stages=stages)


def test_omni_stages_split_between_cuda_and_cpu(tmp_path):
    ckpt = make_tiny_qwen3_omni(tmp_path / "omni", dtype=torch.float64)
    spec = tiny_qwen3_omni_deploy(ckpt)
    names = [s.name for s in spec.stages]
    with Omni(spec, in_process=True) as omni:
        cpu = omni.generate(PROMPTS, PARAMS)
    placed = _placed(spec, {names[0]: "cuda:0", names[-1]: "cuda:0"})
    with Omni(placed, in_process=True) as omni:
        gpu = omni.generate(PROMPTS, PARAMS)
    for a, b in zip(cpu, gpu, strict=True):
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.token_ids == b.token_ids
        assert a.audio.shape == b.audio.shape and a.audio.size > 0
        np.testing.assert_allclose(a.audio, b.audio, rtol=0, atol=1e-6)


def test_image_pipeline_on_cuda(tmp_path):
    ckpt = make_tiny_glm_image(tmp_path / "glm")
    params = {
        "prior": SamplingParams(temperature=0.0),
        "draw": DiffusionParams(height=64, width=96, num_inference_steps=2, seed=7),
    }
    images = {}
    for device in ("cpu", "cuda"):
        with Omni(model=str(ckpt), in_process=True, dtype="float64", device=device) as omni:
            out = omni.generate(["a cat on a mat"], params)[0]
        assert out.error is None, out.error
        images[device] = out.image_array.astype(np.int16)
    assert np.abs(images["cpu"] - images["cuda"]).max() <= 1
