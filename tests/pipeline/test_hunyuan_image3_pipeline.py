"""HunyuanImage-3 end to end on a tiny float64 checkpoint (`demo-hunyuan-image3`'s deploy):
our autoregressive stage thinks, recaptions and opens the image with its own sampler,
the edge hands the whole context to the draw stage, which denoises and decodes it.

- sync == async scheduling of the thinker, alone == batched: the same tokens and the
  same image bytes;
- the image is exactly the denoiser's (`denoise.py`, parity-tested against the
  reference in tests/models/test_hunyuan_image3_image_head.py) on that context, cut
  after `<boi>` and given the request size's ratio token, with `<cfg>` in place of each
  text token for guidance, then the VAE decoder's;
- a size outside the model's resolution group is refused up front, naming it;
- an answer that ended before its `<boi>` is drawn from what it wrote.

The checkpoint's base size is 64 (`image_base_size=64`): 64 x 64 images from 4 x 4
latent tokens, so each image takes milliseconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from omnistage.diffusion.params import DiffusionParams
from omnistage.families.hunyuan_image3.denoise import DenoiseRequest, HunyuanImageDenoiser
from omnistage.families.hunyuan_image3.tiny import make_tiny_hunyuan_image3, token_ids
from omnistage.families.hunyuan_image3.vae_decoder import VaeDecoder
from omnistage.pipeline.deploy import packaged_deploy_path
from omnistage.pipeline.omni import Omni

PROMPTS = ["a cat on a mat", "a red bicycle", "two dogs"]
IDS = token_ids(64)
DRAW = {"height": 64, "width": 64, "num_inference_steps": 2, "guidance_scale": 2.5}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_hunyuan_image3(tmp_path_factory.mktemp("hy3"), seed=0, image_base_size=64)


def deploy(async_scheduling: bool) -> dict:
    spec = yaml.safe_load(packaged_deploy_path("demo-hunyuan-image3").read_text())
    for stage in spec["stages"]:
        stage["engine_args"]["dtype"] = "float64"
    spec["stages"][0]["engine_args"]["async_scheduling"] = async_scheduling
    return spec


def generate(omni: Omni, prompts: list[str]) -> list[tuple[list[int], np.ndarray]]:
    params = [DiffusionParams(**DRAW, seed=PROMPTS.index(p)) for p in prompts]
    chats = [{"messages": [{"role": "user", "content": p}]} for p in prompts]
    outs = omni.generate(chats, params)
    assert all(o.error is None for o in outs), [o.error for o in outs]
    assert all(not any(c.values()) for c in omni.stage_counters().values())
    return [(o.outputs["thinker"].token_ids, o.image_array) for o in outs]


@pytest.fixture(scope="module")
def sync(ckpt):
    with Omni(deploy(False), model=str(ckpt), in_process=True) as omni:
        return generate(omni, PROMPTS)


@pytest.fixture(scope="module")
def omni(ckpt):
    with Omni(deploy(True), model=str(ckpt), in_process=True) as omni:
        yield omni


def test_same_tokens_and_image_bytes_sync_async_alone_batched(sync, omni):
    batched = generate(omni, PROMPTS)
    for (tokens_a, image_a), (tokens_b, image_b) in zip(sync, batched, strict=True):
        assert tokens_a == tokens_b and np.array_equal(image_a, image_b)
        assert image_a.shape == (64, 64, 3) and image_a.std() > 0
        # the sections the sampler forces, then the size's ratio token and the end
        boi = tokens_a.index(IDS["<boi>"])
        assert tokens_a[boi - 2 : boi] == [IDS["</recaption>"], IDS["<answer>"]]
        assert tokens_a[boi + 1] == IDS["<img_size_64>"] and tokens_a[-1] == 2
    alone = generate(omni, PROMPTS[1:2])[0]
    assert alone[0] == sync[1][0] and np.array_equal(alone[1], sync[1][1])
    assert not np.array_equal(sync[0][1], sync[1][1])


def test_image_is_the_denoiser_on_the_context(ckpt, sync):
    tokens, image = sync[0]
    tok = AutoTokenizer.from_pretrained(ckpt)
    text = tok.apply_chat_template(
        [{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("assistant\n<think>")  # think -> recaption -> image
    context = tok(text, add_special_tokens=False).input_ids + tokens
    boi = len(context) - context[::-1].index(IDS["<boi>"])
    context = context[:boi] + [IDS["<img_size_64>"], IDS["<img_ratio_16>"]]  # 64 x 64
    specials = set(IDS.values()) | {0, 1, 2}
    uncond = [t if t in specials else IDS["<cfg>"] for t in context]
    denoiser = HunyuanImageDenoiser.from_checkpoint(ckpt, torch.float64)
    noise = torch.randn((1, 4, 4, 4), generator=torch.Generator().manual_seed(0)).double()
    request = DenoiseRequest(context, uncond, 4, 4, 2, 2.5, 3.0)
    latents = denoiser.generate(request, noise)
    from safetensors.torch import load_file

    vae = VaeDecoder(denoiser.config.vae, torch.float64)
    vae.load(load_file(str(ckpt / "model.safetensors")))
    with torch.no_grad():
        pixels = (vae(latents) / 2 + 0.5).clamp(0, 1)
    expected = (pixels[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    assert np.array_equal(image, expected)


def test_size_outside_the_resolution_group_is_refused_up_front(omni):
    with pytest.raises(ValueError, match="height/width: 64x48 is not one of"):
        omni.generate(["a cat"], DiffusionParams(height=64, width=48))
    assert all(not any(c.values()) for c in omni.stage_counters().values())


def test_the_image_context_ends_with_boi_even_when_the_answer_was_cut(ckpt):
    from omnistage.families.hunyuan_image3.pipeline import HunyuanImage3Pipeline

    pipe = HunyuanImage3Pipeline.load(ckpt, torch.float64, torch.device("cpu"))
    answer, boi = IDS["<answer>"], IDS["<boi>"]
    full = [5, answer, boi, IDS["<img_size_64>"], IDS["<img_ratio_3>"], 2]
    assert pipe.image_context(full) == [5, answer, boi]  # its own size and ratio dropped
    assert pipe.image_context([5, 6, 2]) == [5, 6, answer, boi]  # ended before its image
    assert pipe.image_context([5, answer]) == [5, answer, boi]  # cut by max_tokens
    with pytest.raises(ValueError, match="prior_tokens: the context is empty"):
        pipe.image_context([])


def test_a_checkpoint_folder_is_served_with_the_packaged_deploy(ckpt):
    from omnistage.pipeline.deploy import check_stage_models, deploy_for_model

    spec = deploy_for_model(str(ckpt))
    assert spec.name == "hunyuan-image3"
    assert [(s.name, s.kind, s.model) for s in spec.stages] == [
        ("thinker", "ar", str(ckpt)),
        ("draw", "diffusion", str(ckpt)),
    ]
    check_stage_models(spec)  # both stages find what they run in the one folder
